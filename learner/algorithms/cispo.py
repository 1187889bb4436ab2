"""CISPO: clipped importance-sampling policy optimization (MiniMax-M1, arXiv 2506.13585).

GRPO's advantages with CISPO's loss: REINFORCE weighted by the clipped, detached importance weight
(:func:`learner.losses.cispo_policy_loss`), so every token keeps a gradient however far its ratio moved
(PPO's clip drops it). The paper sets no lower bound (``clip_low`` 1: weights in [0, 1 + clip_high]) and
tunes only the upper one; 0.28 is DAPO's clip-higher value. The loss is a token mean over the batch, as
in the paper. The same loss is available to every policy-gradient algorithm as ``policy_loss: cispo``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from agentgym_rl.learner.algorithms.base import register_algorithm
from agentgym_rl.learner.algorithms.grpo import GRPO, GRPOParams


class CISPOParams(GRPOParams):
    policy_loss: Literal["cispo"] = Field("cispo", description="CISPO's clipped-weight loss (fixed).")
    clip_low: float | None = Field(
        1.0, gt=0.0, le=1.0, description="Weight clip range below 1; 1 (the default) sets no lower bound."
    )
    clip_high: float | None = Field(0.28, gt=0.0, description="Weight clip range above 1.")


@register_algorithm
class CISPO(GRPO):
    """GRPO advantages, CISPO's clipped importance-weight loss."""

    name = "cispo"
    Config = CISPOParams
    config: CISPOParams

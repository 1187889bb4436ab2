"""GSPO: group sequence policy optimization (Zheng et al. 2025, arXiv 2507.18071).

GRPO's advantages with a sequence-level importance ratio: the episode's length-normalised likelihood
ratio s = exp(mean_t log(pi / pi_old)) is clipped, so a whole episode is in or out of the trust region
(:func:`learner.losses.gspo_policy_loss`). The loss is averaged per episode (``seq_mean``), as in the
paper, and the clip range is the paper's (3e-4 below, 4e-4 above 1). The same surrogate is available to
every policy-gradient algorithm as ``policy_loss: gspo``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from agentgym_rl.learner.algorithms.base import register_algorithm
from agentgym_rl.learner.algorithms.grpo import GRPO, GRPOParams


class GSPOParams(GRPOParams):
    policy_loss: Literal["gspo"] = Field("gspo", description="GSPO's sequence-ratio surrogate (fixed).")
    aggregation: Literal["token_mean", "seq_mean"] = Field(
        "seq_mean", description="Loss reduction; GSPO averages within each episode first, then over episodes."
    )
    clip_low: float | None = Field(
        3e-4, gt=0.0, le=1.0, description="Sequence-ratio clip range below 1 (the paper's 3e-4)."
    )
    clip_high: float | None = Field(4e-4, gt=0.0, description="Sequence-ratio clip range above 1 (the paper's 4e-4).")


@register_algorithm
class GSPO(GRPO):
    """GRPO advantages, GSPO's sequence-level ratio and clip."""

    name = "gspo"
    Config = GSPOParams
    config: GSPOParams

"""GRPO: group-relative outcome advantages (Shao et al. 2024), as AgentGym-RL trains with it."""

from __future__ import annotations

import torch
from pydantic import Field
from typing_extensions import override

from learner.advantages import grpo_advantages
from learner.algorithms.base import GROUPS, LOSS_MASK, REWARDS, register_algorithm
from learner.algorithms.policy_gradient import GroupRelative, GroupRelativeParams


class GRPOParams(GroupRelativeParams):
    adv_eps: float = Field(1e-6, gt=0.0, description="Added to the group std when normalising advantages.")
    normalize_std: bool = Field(True, description="Divide by the group std (False: the Dr. GRPO variant).")


@register_algorithm
class GRPO(GroupRelative):
    """Every sampled token of an episode gets the episode's group-normalised outcome advantage."""

    name = "grpo"
    Config = GRPOParams
    config: GRPOParams

    @override
    def estimate_advantages(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        per_episode = grpo_advantages(batch[REWARDS], batch[GROUPS], self.config.adv_eps, self.config.normalize_std)
        return per_episode[:, None] * batch[LOSS_MASK]  # (B, T)

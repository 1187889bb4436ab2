"""RLOO: REINFORCE with a leave-one-out baseline from the other episodes of the same task."""

from __future__ import annotations

import torch
from typing_extensions import override

from learner.advantages import rloo_advantages
from learner.algorithms.base import GROUPS, LOSS_MASK, REWARDS, register_algorithm
from learner.algorithms.policy_gradient import GroupRelative


@register_algorithm
class RLOO(GroupRelative):
    """Every sampled token of an episode gets r_i - mean(r_j, j != i) over its group."""

    name = "rloo"

    @override
    def estimate_advantages(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return rloo_advantages(batch[REWARDS], batch[GROUPS])[:, None] * batch[LOSS_MASK]  # (B, T)

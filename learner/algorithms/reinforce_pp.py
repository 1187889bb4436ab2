"""REINFORCE++: discounted per-token returns with global whitening (Hu 2025)."""

from __future__ import annotations

import torch
from pydantic import Field
from typing_extensions import override

from learner.advantages import reinforce_pp_advantages
from learner.algorithms.base import LOSS_MASK, TOKEN_REWARDS, register_algorithm
from learner.algorithms.policy_gradient import PolicyGradient, PolicyGradientParams


class ReinforcePPParams(PolicyGradientParams):
    gamma: float = Field(1.0, ge=0.0, le=1.0, description="Discount per sampled token.")


@register_algorithm
class ReinforcePP(PolicyGradient):
    """Token returns over sampled tokens only (environment tokens pass them through), whitened over
    the batch. Per-turn rewards sit on the last sampled token of their turn."""

    name = "reinforce_pp"
    Config = ReinforcePPParams
    config: ReinforcePPParams

    @override
    def estimate_advantages(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return reinforce_pp_advantages(batch[TOKEN_REWARDS], batch[LOSS_MASK], self.config.gamma)

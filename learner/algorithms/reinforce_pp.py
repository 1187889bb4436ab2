"""REINFORCE++: discounted per-token returns with global whitening (Hu 2025)."""

from __future__ import annotations

import torch
from pydantic import Field, model_validator
from typing_extensions import override

from agentgym_rl.learner.advantages import reinforce_pp_advantages, spread_turns, whiten
from agentgym_rl.learner.algorithms.base import LOSS_MASK, TOKEN_REWARDS, TURN_IDS, register_algorithm
from agentgym_rl.learner.algorithms.policy_gradient import PolicyGradient, PolicyGradientParams, TurnCreditParams


class ReinforcePPParams(PolicyGradientParams, TurnCreditParams):
    gamma: float = Field(1.0, ge=0.0, le=1.0, description="Discount per sampled token (credit=outcome).")

    @model_validator(mode="after")
    def _gamma_is_per_token(self) -> ReinforcePPParams:
        if self.gamma != 1.0 and self.credit == "turn":
            raise ValueError("gamma discounts per token (credit=outcome); with credit=turn set turn_gamma instead")
        return self


@register_algorithm
class ReinforcePP(PolicyGradient):
    """Token returns over sampled tokens only (environment tokens pass them through), whitened over
    the batch. Per-turn rewards sit on the last sampled token of their turn. With ``credit=turn`` the
    returns are turn-level (every token of turn k gets G_k, discounted by ``turn_gamma`` per turn)."""

    name = "reinforce_pp"
    Config = ReinforcePPParams
    config: ReinforcePPParams

    @override
    def estimate_advantages(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.config.credit == "turn":
            returns = spread_turns(self.turn_returns(batch, self.config.turn_gamma), batch[TURN_IDS])  # (B, T)
            return whiten(returns, batch[LOSS_MASK])
        return reinforce_pp_advantages(batch[TOKEN_REWARDS], batch[LOSS_MASK], self.config.gamma)

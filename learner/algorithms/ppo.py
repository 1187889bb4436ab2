"""PPO with GAE and a critic (Schulman et al. 2017), over multi-turn token sequences."""

from __future__ import annotations

import torch
from pydantic import Field
from typing_extensions import override

from agentgym_rl.learner.advantages import gae
from agentgym_rl.learner.algorithms.base import (
    LOSS_MASK,
    OLD_VALUES,
    RETURNS,
    TOKEN_REWARDS,
    VALUES,
    register_algorithm,
)
from agentgym_rl.learner.algorithms.policy_gradient import PolicyGradient, PolicyGradientParams
from agentgym_rl.learner.losses import aggregate, clipped_value_loss


class PPOParams(PolicyGradientParams):
    gamma: float = Field(1.0, ge=0.0, le=1.0, description="Discount per sampled token.")
    lam: float = Field(0.95, ge=0.0, le=1.0, description="GAE lambda.")
    vf_coef: float = Field(0.5, ge=0.0, description="Weight of the value loss.")
    value_clip: float | None = Field(0.2, gt=0.0, description="Clip range of the value update (None: no clip).")
    critic_lr: float | None = Field(None, gt=0.0, description="Critic learning rate (None: learner.lr).")


@register_algorithm
class PPO(PolicyGradient):
    """GAE advantages from a critic that bootstraps across environment segments: the value after a
    reply is the value of the next reply's first sampled token."""

    name = "ppo"
    Config = PPOParams
    config: PPOParams
    needs_critic = True

    @override
    def estimate_advantages(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        advantages, returns = gae(
            batch[TOKEN_REWARDS], batch[OLD_VALUES], batch[LOSS_MASK], self.config.gamma, self.config.lam
        )
        batch[RETURNS] = returns
        return advantages

    @override
    def compute_loss(
        self, batch: dict[str, torch.Tensor], forward_out: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        loss, metrics = self.policy_loss(batch, forward_out)
        value_loss = aggregate(
            clipped_value_loss(forward_out[VALUES], batch[OLD_VALUES], batch[RETURNS], self.config.value_clip),
            batch[LOSS_MASK],
            self.config.aggregation,
        )
        metrics["learner/value_loss"] = float(value_loss.detach())
        return loss + self.config.vf_coef * value_loss, metrics

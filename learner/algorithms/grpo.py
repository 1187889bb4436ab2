"""GRPO: group-relative outcome advantages (Shao et al. 2024), as AgentGym-RL trains with it."""

from __future__ import annotations

import torch
from pydantic import Field
from typing_extensions import override

from agentgym_rl.learner.advantages import grpo_advantages, grpo_turn_advantages, spread_turns
from agentgym_rl.learner.algorithms.base import COUNTED, GROUPS, LOSS_MASK, REWARDS, TURN_IDS, register_algorithm
from agentgym_rl.learner.algorithms.policy_gradient import GroupRelative, GroupRelativeParams, TurnCreditParams


class GRPOParams(GroupRelativeParams, TurnCreditParams):
    adv_eps: float = Field(1e-6, gt=0.0, description="Added to the group std when normalising advantages.")
    normalize_std: bool = Field(True, description="Divide by the group std (False: the Dr. GRPO variant).")


@register_algorithm
class GRPO(GroupRelative):
    """Every sampled token of an episode gets the episode's group-normalised outcome advantage; with
    ``credit=turn`` every token of turn k gets its turn-level return normalised by the group's statistics
    of episode returns (:func:`learner.advantages.grpo_turn_advantages`)."""

    name = "grpo"
    Config = GRPOParams
    config: GRPOParams

    @override
    def estimate_advantages(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.config.credit == "turn":
            returns = self.turn_returns(batch, self.config.turn_gamma)  # (B, K)
            per_turn = grpo_turn_advantages(
                returns, batch[GROUPS], self.config.adv_eps, self.config.normalize_std, batch[COUNTED]
            )
            return spread_turns(per_turn, batch[TURN_IDS])  # (B, T)
        per_episode = grpo_advantages(
            batch[REWARDS], batch[GROUPS], self.config.adv_eps, self.config.normalize_std, batch[COUNTED]
        )
        return per_episode[:, None] * batch[LOSS_MASK]  # (B, T)

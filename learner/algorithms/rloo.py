"""RLOO: REINFORCE with a leave-one-out baseline from the other episodes of the same task."""

from __future__ import annotations

import torch
from typing_extensions import override

from agentgym_rl.learner.advantages import rloo_advantages, rloo_turn_advantages, spread_turns
from agentgym_rl.learner.algorithms.base import COUNTED, GROUPS, LOSS_MASK, REWARDS, TURN_IDS, register_algorithm
from agentgym_rl.learner.algorithms.policy_gradient import GroupRelative, GroupRelativeParams, TurnCreditParams


class RLOOParams(GroupRelativeParams, TurnCreditParams):
    """RLOO's keys: the group-relative ones and the turn-credit ones."""


@register_algorithm
class RLOO(GroupRelative):
    """Every sampled token of an episode gets r_i - mean(r_j, j != i) over its group; with ``credit=turn``
    every token of turn k gets G_k minus the other episodes' mean episode return."""

    name = "rloo"
    Config = RLOOParams
    config: RLOOParams

    @override
    def estimate_advantages(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.config.credit == "turn":
            returns = self.turn_returns(batch, self.config.turn_gamma)  # (B, K)
            return spread_turns(rloo_turn_advantages(returns, batch[GROUPS], batch[COUNTED]), batch[TURN_IDS])  # (B, T)
        return rloo_advantages(batch[REWARDS], batch[GROUPS], batch[COUNTED])[:, None] * batch[LOSS_MASK]  # (B, T)

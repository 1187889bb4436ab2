"""GiGPO: group-in-group policy optimization (Feng et al. 2025, arXiv 2505.10978).

Two levels of group-relative credit, no critic. The episode level is GRPO's: an episode's reward
against its task group. The step level compares turns that acted from the same environment state
("anchor states"): the turns of one group's episodes whose env state key is equal (revisits within
an episode included) form a step group, and each turn's discounted return is normalised within it.
A token of turn k of episode i gets A_E(i) + step_weight * A_S(i, k).

The env supplies the state key through ``TextEnv.state_key`` (BabyAI, TextCraft, SciWorld, Deep Search,
web and target-word do); a turn without one, or alone in its step group, gets the episode-level advantage only,
so on an env without state keys GiGPO is GRPO (the driver warns at start).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING

import torch
from pydantic import Field
from typing_extensions import override

from agentgym_rl.learner.advantages import gigpo_step_advantages, grpo_advantages, spread_turns, turn_states
from agentgym_rl.learner.algorithms.base import (
    COUNTED,
    GROUPS,
    LOSS_MASK,
    REWARDS,
    STATE_IDS,
    TURN_IDS,
    register_algorithm,
)
from agentgym_rl.learner.algorithms.policy_gradient import GroupRelative, GroupRelativeParams, turn_level_returns
from agentgym_rl.learner.losses import masked_mean

if TYPE_CHECKING:
    from agentgym_rl.actors.trajectory import Trajectory

# (B, T) column GiGPO adds: 1 on the tokens of turns whose step group has another member.
ANCHORED = "anchored"


class GiGPOParams(GroupRelativeParams):
    gamma: float = Field(
        0.95, ge=0.0, le=1.0, description="Discount per turn of the step-level returns (the paper's 0.95)."
    )
    step_weight: float = Field(1.0, ge=0.0, description="Weight omega of the step-level advantage.")
    adv_eps: float = Field(1e-6, gt=0.0, description="Added to the group std when normalising advantages.")
    normalize_std: bool = Field(
        True, description="Divide both levels by their group's std (verl-agent's mean_std_norm); False: mean_norm."
    )


@register_algorithm
class GiGPO(GroupRelative):
    """Episode-level GRPO advantages plus step-level advantages over anchor states."""

    name = "gigpo"
    Config = GiGPOParams
    config: GiGPOParams

    @property
    @override
    def uses_state_keys(self) -> bool:
        return True

    @override
    def compared_values(self, trajectory: Trajectory) -> dict[Hashable, list[float]]:
        """The episode's shaped reward, compared across the group's episodes, and each anchored turn's discounted
        return, compared within its step group (the group's turns from the same state): a group whose episodes
        all got the same reward still carries signal when a shared state ranks its turns (e.g. a shorter way to
        success), and none when every step group's returns are equal too (e.g. one path taken by every episode)."""
        rewards = self.shaped_turn_rewards(trajectory)
        compared: dict[Hashable, list[float]] = {"episode": [sum(rewards)]}
        returns = turn_level_returns(rewards, self.config.gamma)
        for state, turn_return in zip(trajectory.state_keys, returns, strict=False):  # no keys in older records
            if state is not None:
                compared.setdefault(("state", state), []).append(turn_return)
        return compared

    @override
    def estimate_advantages(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        cfg = self.config
        episode = grpo_advantages(batch[REWARDS], batch[GROUPS], cfg.adv_eps, cfg.normalize_std, batch[COUNTED])  # (B,)
        returns = self.turn_returns(batch, cfg.gamma)  # (B, K)
        states = turn_states(batch[STATE_IDS], batch[TURN_IDS])  # (B, K)
        step, shared = gigpo_step_advantages(returns, states, batch[GROUPS], cfg.adv_eps, cfg.normalize_std)
        batch[ANCHORED] = spread_turns(shared.float(), batch[TURN_IDS])
        return episode[:, None] * batch[LOSS_MASK] + cfg.step_weight * spread_turns(step, batch[TURN_IDS])

    @override
    def compute_loss(
        self, batch: dict[str, torch.Tensor], forward_out: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        loss, metrics = self.policy_loss(batch, forward_out)
        metrics["learner/gigpo_anchored_token_frac"] = float(masked_mean(batch[ANCHORED], batch[LOSS_MASK]))
        return loss, metrics

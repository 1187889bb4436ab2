"""DPO: Direct Preference Optimization (Rafailov et al. 2023) on pairs of multi-turn episodes.

Two episodes of the same task with different outcome rewards form a pair (chosen = the higher
reward). A sequence's log-probability is summed over its sampled tokens only, so environment
tokens are context, as in multi-turn DPO for agents. The reference model is the starting
checkpoint. The learner receives the pairs as consecutive rows (chosen, rejected) and keeps the
two rows of a pair in one micro-batch.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Literal

import torch
from pydantic import Field
from typing_extensions import override

from agentgym_rl.actors.trajectory import Trajectory
from agentgym_rl.learner.algorithms.base import (
    LOGPROBS,
    LOSS_MASK,
    REF_LOGPROBS,
    Algorithm,
    AlgorithmParams,
    register_algorithm,
)
from agentgym_rl.learner.losses import dpo_loss

PAIR = "pair"
CHOSEN = "chosen"


class DPOParams(AlgorithmParams):
    aggregation: Literal["seq_mean"] = Field(
        "seq_mean", description="DPO's loss is a mean over pairs; only `seq_mean` fits it."
    )
    beta: float = Field(0.1, gt=0.0, description="Inverse temperature of the implicit reward (KL strength).")
    label_smoothing: float = Field(
        0.0,
        ge=0.0,
        lt=0.5,
        description="Probability that a preference label is wrong (conservative DPO); 0: plain DPO.",
    )


def build_pairs(trajectories: list[Trajectory]) -> list[tuple[int, int]]:
    """Preference pairs ``(chosen index, rejected index)`` within each task.

    Episodes are grouped by ``(env, task_id)`` (a fresh rollout's group, or the same task across
    logged runs). Within a task they are ranked by reward (ties keep input order); the best is
    paired with the worst, the second best with the second worst, and so on, each episode used at
    most once; a pair whose rewards tie is skipped, so a task with one outcome gives no pair.
    Episodes without sampled tokens, or whose env failed, are left out. Deterministic: tasks in
    order of first appearance.
    """
    by_task: dict[tuple[str, int], list[int]] = defaultdict(list)
    for index, trajectory in enumerate(trajectories):
        if trajectory.num_sampled_tokens > 0 and not trajectory.failed:
            by_task[(trajectory.env, trajectory.task_id)].append(index)
    pairs: list[tuple[int, int]] = []
    for members in by_task.values():
        ranked = sorted(members, key=lambda i: -trajectories[i].reward)  # stable: ties keep input order
        for k in range(len(ranked) // 2):
            chosen, rejected = ranked[k], ranked[-1 - k]
            if trajectories[chosen].reward > trajectories[rejected].reward:
                pairs.append((chosen, rejected))
    return pairs


@register_algorithm
class DPO(Algorithm):
    """Multi-turn DPO on episode pairs of the same task; see :func:`build_pairs` for the pairing."""

    name = "dpo"
    Config = DPOParams
    config: DPOParams

    @property
    @override
    def needs_reference(self) -> bool:
        return True

    @property
    @override
    def uses_old_logprobs(self) -> bool:
        return False

    @property
    @override
    def differentiates_entropy(self) -> bool:
        return False

    @property
    @override
    def skips_uninformative_groups(self) -> bool:
        return True  # a task whose episodes all got the same reward forms no pair

    @override
    def select_trajectories(self, trajectories: list[Trajectory]) -> list[Trajectory]:
        return [trajectories[i] for pair in build_pairs(trajectories) for i in pair]

    @override
    def micro_batch_groups(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.arange(batch[LOSS_MASK].shape[0]) // 2

    @override
    def compute_advantages(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        rows = torch.arange(batch[LOSS_MASK].shape[0])
        # Rows come as (chosen, rejected) per pair; the columns keep that through micro-batching.
        batch[PAIR] = rows // 2
        batch[CHOSEN] = (rows % 2 == 0).float()
        return torch.zeros_like(batch[LOSS_MASK])

    @override
    def compute_loss(
        self, batch: dict[str, torch.Tensor], forward_out: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        mask = batch[LOSS_MASK]
        logps = (forward_out[LOGPROBS] * mask).sum(-1)  # (B,)
        ref_logps = (batch[REF_LOGPROBS] * mask).sum(-1)  # (B,)
        chosen = batch[CHOSEN].bool()
        # Sorting each side by pair id lines chosen and rejected rows up pair by pair.
        c_order = torch.argsort(torch.where(chosen, batch[PAIR], -1))[int((~chosen).sum()) :]
        r_order = torch.argsort(torch.where(chosen, -1, batch[PAIR]))[int(chosen.sum()) :]
        assert torch.equal(batch[PAIR][c_order], batch[PAIR][r_order]), "a micro-batch split a preference pair"
        loss, margin = dpo_loss(
            logps[c_order],
            logps[r_order],
            ref_logps[c_order],
            ref_logps[r_order],
            self.config.beta,
            self.config.label_smoothing,
        )
        chosen_reward = self.config.beta * (logps[c_order] - ref_logps[c_order]).detach()
        rejected_reward = self.config.beta * (logps[r_order] - ref_logps[r_order]).detach()
        metrics = {
            "learner/dpo_loss": float(loss.detach().mean()),
            "learner/dpo_margin": float(margin.detach().mean()),
            "learner/dpo_accuracy": float((margin.detach() > 0).float().mean()),
            "learner/dpo_chosen_reward": float(chosen_reward.mean()),
            "learner/dpo_rejected_reward": float(rejected_reward.mean()),
        }
        return loss.mean(), metrics

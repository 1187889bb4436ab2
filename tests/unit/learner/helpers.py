"""Synthetic but well-formed multi-turn trajectories for learner tests."""

from __future__ import annotations

import torch
from agentgym_rl.actors.trajectory import Trajectory


def two_turn_trajectory(
    generator: torch.Generator, group: int, reward: float, *, truncated: bool = False
) -> Trajectory:
    """prompt, reply, env text, reply - with random lengths and ids; the reward on the last turn."""
    lengths = [int(torch.randint(3, 9, (1,), generator=generator)) for _ in range(4)]
    ids = torch.randint(10, 2000, (sum(lengths),), generator=generator).tolist()
    mask, spans, start = [], [], 0
    for k, n in enumerate(lengths):
        sampled = k % 2 == 1
        mask += [int(sampled)] * n
        if sampled:
            spans.append((start, start + n))
        start += n
    return Trajectory(
        env="babyai",
        task_id=group,
        group=group,
        token_ids=ids,
        loss_mask=mask,
        logprobs=[-1.0 if m else 0.0 for m in mask],
        prompt_length=lengths[0],
        turn_spans=spans,
        messages=[],
        actions=["a", "b"],
        step_rewards=[0.0, reward],
        reward=reward,
        success=reward > 0,
        done=not truncated,
        truncated=truncated,
        truncation_reason="horizon" if truncated else None,
        horizon=2,
        weights_version=0,
    )


def batch_of(n_groups: int = 3, group_size: int = 3, seed: int = 0) -> list[Trajectory]:
    g = torch.Generator().manual_seed(seed)
    rewards = torch.rand(n_groups * group_size, generator=g).round(decimals=1).tolist()
    return [
        two_turn_trajectory(g, group, rewards[group * group_size + k], truncated=(k == 0 and group == 0))
        for group in range(n_groups)
        for k in range(group_size)
    ]

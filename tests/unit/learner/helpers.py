"""Synthetic but well-formed multi-turn trajectories for learner tests."""

from __future__ import annotations

import torch

from agentgym_rl.actors.trajectory import Trajectory
from tests.factories import make_trajectory


def two_turn_trajectory(
    generator: torch.Generator, group: int, reward: float, *, truncated: bool = False
) -> Trajectory:
    """prompt, reply, env text, reply - with random lengths and ids; the reward on the last turn."""
    lengths = [int(torch.randint(3, 9, (1,), generator=generator)) for _ in range(4)]
    ids = torch.randint(10, 2000, (sum(lengths),), generator=generator).tolist()
    mask = [k % 2 for k, n in enumerate(lengths) for _ in range(n)]  # segments 1 and 3 are the replies
    return make_trajectory(ids, mask, [0.0, reward], group=group, actions=["a", "b"], truncated=truncated)


def batch_of(n_groups: int = 3, group_size: int = 3, seed: int = 0) -> list[Trajectory]:
    g = torch.Generator().manual_seed(seed)
    rewards = torch.rand(n_groups * group_size, generator=g).round(decimals=1).tolist()
    return [
        two_turn_trajectory(g, group, rewards[group * group_size + k], truncated=(k == 0 and group == 0))
        for group in range(n_groups)
        for k in range(group_size)
    ]

"""Which tasks an iteration plays and the seed of each episode, both drawn from the run seed."""

from __future__ import annotations

import numpy as np

from agentgym_rl.driver.errors import TrainError


class TaskSchedule:
    """Seeded draw of the tasks of each iteration (distinct within an iteration); resumable."""

    def __init__(self, tasks: list[int], per_iteration: int, seed: int, *, source: str = "env") -> None:
        if not tasks:
            raise TrainError(f"the env split has no tasks; check {source}.split and {source}.options")
        self.tasks = tasks
        self.per_iteration = min(per_iteration, len(tasks))
        self.rng = np.random.default_rng(seed)

    def next(self, count: int | None = None, exclude: frozenset[int] = frozenset()) -> list[int]:
        """``count`` distinct tasks (default: ``per_iteration``), none of ``exclude``."""
        pool = [task for task in self.tasks if task not in exclude] if exclude else self.tasks
        size = min(count if count is not None else self.per_iteration, len(pool))
        picks = self.rng.choice(len(pool), size=size, replace=False)
        return [pool[int(i)] for i in picks]

    def state(self) -> dict:
        return self.rng.bit_generator.state

    def load_state(self, state: dict) -> None:
        self.rng.bit_generator.state = state


def episode_seed(run_seed: int, iteration: int, group: int, index: int) -> int:
    """The seed of one episode's sampling stream, derived from the run seed (stable across resumes)."""
    return int(np.random.SeedSequence([run_seed, iteration, group, index]).generate_state(1)[0])

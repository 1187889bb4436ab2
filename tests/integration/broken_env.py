"""An env whose ``reset`` raises (``env.name=tests.integration.broken_env:BrokenEnv``): the failure that ends a run
from inside a sampler, which the user must read as one line."""

from __future__ import annotations

from typing_extensions import override

from agentgym_rl.envs.base import EnvError, Observation
from agentgym_rl.envs.target_word import TargetWordEnv

MESSAGE = "the task data of this env is missing"


class BrokenEnv(TargetWordEnv):
    """Target word, but no task can start."""

    name = "broken"
    default_max_turns = 2

    @override
    def reset(self, task_id: int) -> Observation:
        raise EnvError(f"{MESSAGE} (task {task_id})\nthe second line of the message")

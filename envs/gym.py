"""Every registered env as a gymnasium environment with text spaces.

Importing this module registers ``agentgym/<name>-v0`` for each name in ``envs.names()``::

    import gymnasium
    import agentgym_rl.envs.gym  # noqa: F401

    env = gymnasium.make("agentgym/babyai-v0", levels=["GoToRedBall"])
    obs, info = env.reset(options={"task_id": 1})
    obs, reward, terminated, truncated, info = env.step("Action: move forward")

Keyword arguments of ``gymnasium.make`` are the env's options. ``reset`` without a ``task_id`` draws
one from the ``split`` option's task list with the env's seeded ``np_random``. Observations and
actions are strings (``gymnasium.spaces.Text``); the action is the model's raw reply, parsed by the env.
Each registration's ``max_episode_steps`` is the env's ``default_max_turns`` (BabyAI 20, TextCraft,
SciWorld and Deep Search 30, WebArena 15), so gymnasium's ``TimeLimit`` truncates an episode there;
``gymnasium.make(..., max_episode_steps=N)`` picks another limit.
"""

from __future__ import annotations

import string
from typing import Any, ClassVar

import gymnasium
from gymnasium.spaces import Text

from agentgym_rl.envs.base import TextEnv
from agentgym_rl.envs.registry import env_class, make, names

# Text spaces check their charset: printable ASCII plus newline/tab covers the envs' texts.
CHARSET = frozenset(string.printable)
MAX_TEXT = 1_000_000


def gym_id(name: str) -> str:
    """The gymnasium id of env ``name``: ``agentgym/<name>-v0``."""
    return f"agentgym/{name}-v0"


class TextGymEnv(gymnasium.Env[str, str]):
    """A ``TextEnv`` behind gymnasium's API; ``terminated`` is the env's ``done``."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    def __init__(self, env_name: str, split: str = "train", **options: Any) -> None:
        """Create env ``env_name`` with ``options``; tasks drawn by ``reset`` come from ``split``."""
        self.env: TextEnv = make(env_name, options)
        self.split = split
        self.observation_space = Text(max_length=MAX_TEXT, min_length=0, charset=CHARSET)
        self.action_space = Text(max_length=MAX_TEXT, min_length=0, charset=CHARSET)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start task ``options["task_id"]``, or one drawn from the split with the seeded RNG."""
        super().reset(seed=seed)
        options = options or {}
        if "task_id" in options:
            task_id = options["task_id"]
        else:
            tasks = self.env.tasks(self.split)
            task_id = int(tasks[int(self.np_random.integers(len(tasks)))])
        observation = self.env.reset(task_id)
        return observation.text, {**observation.info, "task_id": task_id, "instruction": self.env.instruction}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Apply the model's reply ``action``; returns (observation, reward, terminated, truncated, info)."""
        result = self.env.step(action)
        truncated = bool(result.info.get("truncated", False))
        return result.observation, result.reward, result.done and not truncated, truncated, result.info

    def close(self) -> None:
        self.env.close()


def register_all() -> list[str]:
    """Register ``agentgym/<name>-v0`` for every registered env (idempotent), with the env's
    ``default_max_turns`` as ``max_episode_steps``; returns the ids."""
    ids = []
    for name in names():
        env_id = gym_id(name)
        if env_id not in gymnasium.registry:
            gymnasium.register(
                id=env_id,
                entry_point=TextGymEnv,
                kwargs={"env_name": name},
                max_episode_steps=env_class(name).default_max_turns,
            )
        ids.append(env_id)
    return ids


register_all()

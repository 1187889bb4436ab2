"""A guess-the-number env written with the ``openenv`` package's own server classes (``Environment``, ``create_app``),
not this project's code: the OpenEnv server the ``openenv`` client env is tested against.

Each task hides a number in 0-9 (task ``index`` of split ``train`` or ``test``); a guess is answered with
"higher", "lower" or "correct" (reward 1, done). It has the task API (splits, task counts) and takes its task from
the reset arguments ``split`` and ``index``. Run as a module it serves on 127.0.0.1::

    python -m tests.integration.openenv_guess --port 8000 [--die-at-reset N] [--stall-steps]

``--die-at-reset N`` makes the process exit at its Nth reset (a server killed mid-run); ``--stall-steps`` makes
every step wait forever (a server too slow to answer).
"""

from __future__ import annotations

import argparse
import os
import threading
from typing import Any

from openenv.core.env_server import Action, Environment, Observation, State, create_app
from pydantic import Field

SPLITS = {"train": 12, "test": 4}


class Guess(Action):
    message: str = Field(description="The guess, a number in 0-9.")


class Hint(Observation):
    prompt: str = Field(description="What the player is told.")
    guesses: int = Field(0, description="Guesses made so far.")


def target(split: str, index: int) -> int:
    return (7 * index + (3 if split == "test" else 0)) % 10


class GuessEnv(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True
    resets = 0
    die_at_reset: int | None = None
    stall_steps = False
    _lock = threading.Lock()

    def __init__(self) -> None:
        super().__init__()
        self._state = State()
        self._target = 0

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, split: str = "train", index: int = 0, **_: Any
    ) -> Hint:
        with GuessEnv._lock:
            GuessEnv.resets += 1
            if GuessEnv.resets == GuessEnv.die_at_reset:
                os._exit(1)
        self._target = target(split, index)
        self._state = State(episode_id=episode_id)
        return Hint(prompt=f"Guess the number in 0-9 ({split} task {index}).")

    def step(self, action: Guess, timeout_s: float | None = None, **_: Any) -> Hint:
        if GuessEnv.stall_steps:
            threading.Event().wait()
        self._state.step_count += 1
        words = action.message.split()
        guess = int(words[-1]) if words and words[-1].isdigit() else None
        if guess == self._target:
            return Hint(prompt="correct", guesses=self._state.step_count, reward=1.0, done=True)
        hint = "not a number" if guess is None else ("higher" if guess < self._target else "lower")
        return Hint(prompt=hint, guesses=self._state.step_count, reward=0.0, metadata={"guess": guess})

    @property
    def state(self) -> State:
        return self._state

    def list_splits(self) -> list[str]:
        return list(SPLITS)

    def num_tasks(self, split: str) -> int:
        return SPLITS[split]

    def list_tasks(self, split: str) -> list[dict[str, Any]]:
        return [{"split": split, "index": i} for i in range(SPLITS[split])]


def app():
    """The env's OpenEnv app, 16 sessions at once."""
    return create_app(GuessEnv, Guess, Hint, env_name="guess", max_concurrent_envs=16)


if __name__ == "__main__":
    import uvicorn

    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--die-at-reset", type=int, default=None)
    parser.add_argument("--stall-steps", action="store_true")
    args = parser.parse_args()
    GuessEnv.die_at_reset = args.die_at_reset
    GuessEnv.stall_steps = args.stall_steps
    uvicorn.run(app(), host="127.0.0.1", port=args.port, log_level="warning")

"""A custom environment, checked by its oracle and then trained on: `python docs/examples/custom_env.py`.

Guess the number: the env hides a number between 1 and `high`; each turn the agent guesses and is told
"higher" or "lower". Reward 1 when it finds the number within the horizon. The oracle bisects, so it
always wins within log2(high) + 1 turns; an agent that guesses at random usually does not.

The script plays every test task with the oracle and with random guesses (in this process), then trains
on the env for `--iterations` GRPO iterations with the real actors (`tiny-random` by default: seconds per
iteration; `--model smollm2-135m-instruct` to see a real model play) and checks the run's metrics.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agentgym_rl.envs import EnvError, InvalidAction, Observation, StepResult, TextEnv


class GuessNumberEnv(TextEnv):
    """Find the hidden number from "higher" / "lower" hints."""

    name = "guess-number"
    default_max_turns = 8

    class Options(BaseModel):
        """Options of the guess-the-number env (`env.options`)."""

        model_config = ConfigDict(extra="forbid")

        high: int = Field(32, ge=2, description="The number is drawn from 1 .. high.")
        test_tasks: int = Field(20, ge=1, description="Tasks of the test split: ids 0 .. test_tasks - 1.")
        train_tasks: int = Field(500, ge=1, description="Tasks of the train split: the ids after the test ones.")

    def __init__(self, **options: Any) -> None:
        self.options = self.Options(**options)
        self._secret: int | None = None
        self._low, self._high = 1, self.options.high

    @property
    def instruction(self) -> str:
        return (
            f"I hide a whole number from 1 to {self.options.high}. Guess it; after each guess I say whether "
            "the number is higher or lower. Reply with one line: Action: <number>"
        )

    def tasks(self, split: str) -> Sequence[int]:
        test = self.options.test_tasks
        if split == "test":
            return range(test)
        if split == "train":
            return range(test, test + self.options.train_tasks)
        raise EnvError(f"unknown split {split!r}; valid splits: train, test")

    def reset(self, task_id: int) -> Observation:
        if not isinstance(task_id, int) or not 0 <= task_id < self.options.test_tasks + self.options.train_tasks:
            raise EnvError(f"task id {task_id!r} is not a task of guess-number")
        self._secret = random.Random(task_id).randint(1, self.options.high)
        self._low, self._high = 1, self.options.high
        return Observation(text=f"The number is between 1 and {self.options.high}. Your guess?")

    def parse_action(self, model_text: str) -> str | InvalidAction:
        match = re.search(r"action\s*:\s*(-?\d+)", model_text, re.IGNORECASE)
        if match is None:
            return InvalidAction(reason="No guess found: reply with one line, Action: <number>.")
        return match.group(1)

    def step(self, action_text: str) -> StepResult:
        if self._secret is None:
            raise EnvError("no episode is running; call reset")
        action = self.parse_action(action_text)
        if isinstance(action, InvalidAction):
            return StepResult(observation=action.reason, reward=0.0, done=False, info={"action_valid": False})
        guess = int(action)
        if guess == self._secret:
            self._secret = None
            return StepResult(observation="Correct!", reward=1.0, done=True, info={"success": True})
        if guess < self._secret:
            self._low = max(self._low, guess + 1)
            hint = "higher"
        else:
            self._high = min(self._high, guess - 1)
            hint = "lower"
        return StepResult(observation=f"{guess} is wrong: the number is {hint}.", reward=0.0, done=False)

    def oracle_action(self) -> str:
        """Bisect what the hints have left."""
        if self._secret is None:
            raise EnvError("no episode is running; call reset")
        return f"Action: {(self._low + self._high) // 2}"

    def state_key(self) -> tuple[int, int] | None:
        """The interval the hints have left: episodes that reach it act from the same state."""
        return None if self._secret is None else (self._low, self._high)


def play(env: GuessNumberEnv, task_id: int, policy, max_turns: int) -> bool:
    """One episode; True when it finds the number within ``max_turns``."""
    env.reset(task_id)
    for _ in range(max_turns):
        result = env.step(policy())
        if result.done:
            return True
    return False


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-random")
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--run-dir", default=None, help="parent of the run directory (default: a temporary one)")
    args = parser.parse_args(argv)

    env = GuessNumberEnv()
    turns = GuessNumberEnv.default_max_turns
    rng = random.Random(0)
    oracle = sum(play(env, t, env.oracle_action, turns) for t in env.tasks("test"))
    guesses = sum(play(env, t, lambda: f"Action: {rng.randint(1, 32)}", turns) for t in env.tasks("test"))
    print(f"test split, {turns} turns: oracle solves {oracle}/20, random guesses {guesses}/20")
    assert oracle == 20 and guesses < oracle

    # Train on it. Env actors and learners import the env by "module:Class", so this file's folder goes on
    # PYTHONPATH before Ray starts (its workers inherit it); `agentgym-rl train` is called as a user would.
    here = str(Path(__file__).resolve().parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    sys.path.insert(0, here)
    from agentgym_rl.driver.cli import main as agentgym_rl

    runs = args.run_dir or tempfile.mkdtemp(prefix="custom-env-")
    settings = {
        "env.name": "custom_env:GuessNumberEnv",
        "env.options": "{high: 32}",
        "model.name": args.model,
        "warm_start.iterations": 0,
        "curriculum.schedule": "fixed",
        "curriculum.horizon": turns,
        "trainer.iterations": args.iterations,
        "trainer.tasks_per_iteration": 4,
        "algorithm.group_size": 4,
        "sampler.envs_per_sampler": 8,
        "sampler.sampling.max_new_tokens": 12,
        "logging.progress": False,
        "run.dir": runs,
        "run.name": "guess-number",
    }
    overrides = [item for key, value in settings.items() for item in ("--set", f"{key}={value}")]
    status = agentgym_rl(["train", "warm_start_grpo.yaml", *overrides])
    assert status == 0, f"training exited with {status}"

    records = [json.loads(line) for line in (Path(runs) / "guess-number" / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in records] == list(range(args.iterations))
    assert all(r["rollout/episodes"] == 16 for r in records)
    for record in records:
        print(
            f"iteration {record['iteration']}: success rate {record['success_rate']:.2f}, turns {record['rollout/turns_mean']:.1f}"
        )
    print(f"run directory: {Path(runs) / 'guess-number'}")


if __name__ == "__main__":
    main()

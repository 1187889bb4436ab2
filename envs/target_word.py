"""Target word: a small multi-turn env whose reward a small model can learn in minutes.

Made for tests and for trying an algorithm out: a sign or plumbing error in a policy-gradient
algorithm shows as a success rate that does not rise here.

Tasks
    Task id ``i`` seeds its own ``random.Random(i)``; each of the episode's ``turns`` turns shows
    ``choices`` distinct words drawn from ``WORDS`` and names one of them as the target. Splits
    (deterministic): ``test`` is ids ``0 .. test_tasks - 1``, ``train`` the next ``train_tasks``.

Observations and actions
    ``Choices: apple, river, stone, cloud. Target: stone.`` The reply's action is the text after
    ``Action:`` when there is one, else the whole reply; it is correct when it names the target and
    no other choice. Any reply is a valid action (a wrong one just earns nothing).

Reward and end
    ``1 / turns`` for each correct turn; the episode ends after ``turns`` turns and succeeds when
    every turn was correct. The oracle answers ``Action: <target>``.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import override

from agentgym_rl.envs.base import EnvError, InvalidAction, Observation, StepResult, TextEnv, action_after_marker

WORDS: tuple[str, ...] = (
    "apple", "river", "stone", "cloud", "tiger", "candle", "mirror", "garden",
    "rocket", "pencil", "button", "forest", "window", "silver", "planet", "bottle",
)  # fmt: skip

_INSTRUCTION = (
    "You play a word game. Each turn shows a few words and names the target among them. "
    "Reply with one line: Action: <the target word>"
)


class TargetWordEnv(TextEnv):
    """Name the target word among the choices, turn after turn."""

    name = "target-word"

    class Options(BaseModel):
        """Options of the target-word environment."""

        model_config = ConfigDict(extra="forbid")

        turns: int = Field(2, ge=1, le=10, description="Turns per episode, each with its own target.")
        choices: int = Field(4, ge=2, le=len(WORDS), description="Words shown per turn (the target among them).")
        test_tasks: int = Field(64, ge=1, description="Tasks of the test split (ids 0 .. test_tasks - 1).")
        train_tasks: int = Field(1000, ge=1, description="Tasks of the train split (the ids after the test ones).")

    def __init__(self, **options: Any) -> None:
        self.options = self.Options(**options)
        self._turns: list[tuple[list[str], str]] = []
        self._turn = 0
        self._correct = 0

    @property
    def instruction(self) -> str:
        """System prompt: the game and the ``Action: <word>`` reply format."""
        return _INSTRUCTION

    def tasks(self, split: str) -> Sequence[int]:
        """``test``: ids ``0 .. test_tasks - 1``; ``train``: the ``train_tasks`` ids after them."""
        test = self.options.test_tasks
        if split == "test":
            return range(test)
        if split == "train":
            return range(test, test + self.options.train_tasks)
        raise EnvError(f"unknown split {split!r}; valid splits: train, test")

    def reset(self, task_id: int) -> Observation:
        """Start task ``task_id``: its words and targets follow from the id alone."""
        if isinstance(task_id, bool) or not isinstance(task_id, int) or task_id < 0:
            raise EnvError(f"task id must be a non-negative integer, got {task_id!r}")
        if task_id >= self.options.test_tasks + self.options.train_tasks:
            raise EnvError(
                f"task id {task_id} is outside both splits (0 .. {self.options.test_tasks + self.options.train_tasks - 1})"
            )
        rng = random.Random(task_id)
        self._turns = []
        for _ in range(self.options.turns):
            words = rng.sample(WORDS, self.options.choices)
            self._turns.append((words, rng.choice(words)))
        self._turn = 0
        self._correct = 0
        return Observation(text=self._prompt(), info={"task_id": task_id, "target": self._turns[0][1]})

    def parse_action(self, model_text: str) -> str | InvalidAction:
        """The text after the last ``Action:``, else the whole reply, lowercased."""
        return action_after_marker(model_text) or " ".join(model_text.split()).lower()

    def step(self, action_text: str) -> StepResult:
        """Score the reply against this turn's target and show the next turn's words."""
        if self._turn >= len(self._turns):
            raise EnvError("episode is over; call reset")
        words, target = self._turns[self._turn]
        named = set(re.findall(r"[a-z]+", str(self.parse_action(action_text)))) & set(words)
        correct = named == {target}
        self._correct += correct
        self._turn += 1
        done = self._turn == len(self._turns)
        verdict = "Correct." if correct else f"Wrong: the target was {target}."
        return StepResult(
            observation=verdict if done else f"{verdict}\n{self._prompt()}",
            reward=(1.0 if correct else 0.0) / len(self._turns),
            done=done,
            info={"success": done and self._correct == len(self._turns), "action_valid": True},
        )

    def state_key(self) -> int | None:
        """The turn about to be played: the words shown depend on the task and the turn only (None before a
        reset)."""
        return self._turn if self._turns else None

    @override
    def oracle_action(self) -> str:
        """This turn's target."""
        if self._turn >= len(self._turns):
            raise EnvError("episode is over; call reset")
        return self._turns[self._turn][1]

    def oracle_actions(self, task_id: int) -> list[str]:
        """Reset to ``task_id`` and return its targets, one per turn (the oracle's whole episode)."""
        self.reset(task_id)
        return [target for _, target in self._turns]

    def _prompt(self) -> str:
        words, target = self._turns[self._turn]
        return f"Choices: {', '.join(words)}. Target: {target}."

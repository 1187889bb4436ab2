"""The text-environment protocol every environment implements.

An environment is a small synchronous object: ``reset(task_id)`` starts an episode and
``step(action_text)`` advances it. Environments never raise on bad model output: an action
that cannot be parsed or executed comes back as an observation that says what was wrong.
"""

from __future__ import annotations

import abc
import hashlib
import re
from collections.abc import Hashable, Sequence
from typing import Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from agentgym_rl.configs.errors import AgentGymError
from agentgym_rl.envs.tools import Function, ToolCall, function_named

_ACTION_MARKER = re.compile(r"action\s*:", re.IGNORECASE)
_QUOTES = "\"'`"


def action_after_marker(model_text: str) -> str:
    """The action in an ``...Action: <action>`` reply, normalised; "" when there is none.

    Takes the first non-empty line after the last ``Action:`` (any case), strips quotes and a
    trailing period, collapses whitespace and lowercases it: models often decorate action names.
    """
    matches = list(_ACTION_MARKER.finditer(model_text))
    if not matches:
        return ""
    lines = (line.strip() for line in model_text[matches[-1].end() :].splitlines())
    action = next((line for line in lines if line), "")
    action = action.strip(_QUOTES).strip().rstrip(".").strip().strip(_QUOTES).strip()
    return " ".join(action.split()).lower()


class EnvError(AgentGymError):
    """Raised for caller errors that are not model output: unknown task ids, unknown splits."""


class EnvUnavailable(EnvError):
    """The env cannot go on with its episode: the process or server behind it died, hung or answered garbage.

    A sampler moves the episode to a fresh env actor once, then records it as failed (never trained on), and the
    run goes on; the message names the server so the log says which one failed.
    """


class Observation(BaseModel):
    """What the agent sees after ``reset``: the first user message of the episode."""

    model_config = ConfigDict(extra="forbid")

    text: str = Field(description="Observation text shown to the model.")
    info: dict[str, Any] = Field(default_factory=dict, description="Env-specific extras (level, seed, ...).")
    state_key: str | None = Field(
        None,
        description="Digest of the env's `state_key()` after the reset (filled in by the env host); None when "
        "the env has no state key.",
    )


class StepResult(BaseModel):
    """Outcome of one ``step``."""

    model_config = ConfigDict(extra="forbid")

    observation: str = Field(description="Observation text after the action (or why the action failed).")
    reward: float = Field(description="Reward for this step.")
    done: bool = Field(description="True when the episode has ended (success or failure).")
    info: dict[str, Any] = Field(default_factory=dict, description="Extras: `success`, `action_valid`, ...")
    state_key: str | None = Field(
        None,
        description="Digest of the env's `state_key()` after the step (filled in by the env host); None when "
        "the env has no state key.",
    )


class InvalidAction(BaseModel):
    """Returned by ``parse_action`` when the model's text holds no usable action."""

    model_config = ConfigDict(extra="forbid")

    reason: str = Field(description="What was wrong, phrased for the model to read.")


class TextEnv(abc.ABC):
    """A multi-turn text environment.

    Subclasses set ``name`` and implement the abstract methods. Task ids are integers whose
    meaning is fixed per environment and documented there; ``tasks(split)`` lists the ids of a split.
    """

    name: str = ""
    default_max_turns: ClassVar[int | None] = None
    """The env's usual turn limit (the paper's evaluation setting where it has one): gymnasium's
    ``max_episode_steps`` for the env. None: episodes end on their own."""

    @property
    @abc.abstractmethod
    def instruction(self) -> str:
        """System prompt: the task format and the action syntax the parser accepts."""

    @abc.abstractmethod
    def tasks(self, split: str) -> Sequence[int]:
        """Task ids of ``split`` (``train`` or ``test``). Raises EnvError for an unknown split."""

    @abc.abstractmethod
    def reset(self, task_id: int) -> Observation:
        """Start the episode of ``task_id``. Raises EnvError for an id outside every split."""

    @abc.abstractmethod
    def step(self, action_text: str) -> StepResult:
        """Apply one action, given as the model's raw text (``parse_action`` is applied here)."""

    @abc.abstractmethod
    def parse_action(self, model_text: str) -> str | InvalidAction:
        """Extract the action from the model's raw output."""

    def close(self) -> None:
        """Release resources held by the environment (processes, browsers). Default: nothing."""

    def state_key(self) -> Hashable | None:
        """A key of the state the agent acts from now (after ``reset`` or the last ``step``): equal keys mean
        the same state, so turns of a task's episodes that share it are compared by step-level credit
        (GiGPO's anchor states, arXiv 2505.10978). Default: None, the env cannot tell.

        The key is reduced to a digest of its ``repr`` (:func:`state_digest`), so build it from strings,
        numbers, bytes and tuples (never sets, whose order changes between processes).
        """
        return None

    @classmethod
    def has_state_key(cls) -> bool:
        """Whether the env overrides :meth:`state_key`."""
        return cls.state_key is not TextEnv.state_key

    def task_category(self, task_id: int) -> str:
        """The category ``task_id`` is reported under in per-category evaluation tables (a level, a task
        family, a difficulty). Default: ``all``, one category for every task.

        Raises:
            EnvError: ``task_id`` is not a task of the env (where the env can tell).
        """
        return "all"

    def episode_score(self, reward: float) -> float:
        """The score an episode whose rewards sum to ``reward`` is reported with (an env may rescale its
        rewards back to its benchmark's scale). Default: the reward."""
        return reward

    @property
    def tool_instruction(self) -> str:
        """System prompt in ``env.action_format: tools``, which the tool format follows with the functions: the
        task, and that each turn acts by calling one function. Default: :attr:`instruction`."""
        return self.instruction

    def functions(self) -> list[Function]:
        """The env's actions as functions, for ``env.action_format: tools`` (see :mod:`agentgym_rl.envs.tools`).
        Default: none, the env is played in text only."""
        return []

    @classmethod
    def has_functions(cls) -> bool:
        """Whether the env overrides :meth:`functions`."""
        return cls.functions is not TextEnv.functions

    def action_of_call(self, call: ToolCall) -> str | InvalidAction:
        """The action text ``call`` stands for, which :meth:`step` then applies, or why it stands for none.

        The default checks that the function is one of :meth:`functions` and that the arguments fit its schema,
        then hands the call to :meth:`action_text` (the one hook an env with functions writes).
        """
        function = function_named(self.functions(), call.name)
        if function is None:
            valid = ", ".join(f.name for f in self.functions()) or "none"
            return InvalidAction(reason=f"there is no function {call.name!r}; the functions are: {valid}")
        if (error := function.argument_error(call.arguments)) is not None:
            return InvalidAction(reason=error)
        return self.action_text(call)

    def action_text(self, call: ToolCall) -> str:
        """The action text of a call already checked against its function's schema (see :meth:`action_of_call`).

        Raises:
            EnvError: the env has no functions.
        """
        raise EnvError(f"env {self.name!r} describes no actions as functions")

    def call_of_action(self, action: str) -> ToolCall | None:
        """The call that stands for the text ``action`` (the inverse of :meth:`action_text`), so that oracle
        demonstrations can be written as tool calls; None when no function expresses it. Default: None."""
        return None

    def oracle_action(self) -> str:
        """The oracle's next action from the current state (an expert that ``sampler.policy=oracle``
        plays). Default: there is none.

        Raises:
            EnvError: the env has no oracle, or the oracle cannot advise now (no episode running, off its plan).
        """
        raise EnvError(f"env {self.name!r} has no oracle")

    @classmethod
    def has_oracle(cls) -> bool:
        """Whether the env overrides :meth:`oracle_action`."""
        return cls.oracle_action is not TextEnv.oracle_action

    def render_frame(self) -> np.ndarray:
        """A picture of the current state, ``(H, W, 3)`` uint8 RGB (the trajectory viewer replays an
        episode's frames). Default: the env has none.

        Raises:
            EnvError: the env has no frames, or no episode has started.
        """
        raise EnvError(f"env {self.name!r} has no frames")

    @classmethod
    def has_frames(cls) -> bool:
        """Whether the env overrides :meth:`render_frame`."""
        return cls.render_frame is not TextEnv.render_frame

    @classmethod
    def replay_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        """The options of an instance that only replays recorded replies (the viewer's frames), from the
        run's ``options``: the env may switch off work a replay does not use. Default: ``options``."""
        return options


def state_digest(key: Hashable | None) -> str | None:
    """A short, process-independent digest of a ``state_key`` (None stays None)."""
    if key is None:
        return None
    return hashlib.blake2b(repr(key).encode(), digest_size=12).hexdigest()


def reply_of_action(env: TextEnv, action: str) -> str:
    """The text to hand to ``env.step`` for ``action``: a bare action (what AgentGym's clients and OpenEnv's text
    actions send) gains an ``Action:`` prefix when only that makes the env parse it; any other text is kept."""
    if isinstance(env.parse_action(action), InvalidAction):
        prefixed = f"Action: {action}"
        if not isinstance(env.parse_action(prefixed), InvalidAction):
            return prefixed
    return action

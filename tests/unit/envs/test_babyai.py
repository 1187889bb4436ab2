"""Tests of the BabyAI text environment against the real minigrid levels."""

from __future__ import annotations

import json
import random

import gymnasium
import numpy as np
import pydantic
import pytest

from agentgym_rl.envs.babyai import LEVELS, NO_ACTION_FOUND, NOT_RECOGNIZED, BabyAIEnv, gym_id
from agentgym_rl.envs.base import EnvError, InvalidAction, StepResult


def available(text: str) -> list[str]:
    """The action list of an observation's last line."""
    last = text.rsplit("\n", 1)[-1]
    assert last.startswith("Available actions: ")
    return json.loads(last.removeprefix("Available actions: "))


@pytest.fixture(scope="module")
def env() -> BabyAIEnv:
    environment = BabyAIEnv()
    yield environment
    environment.close()


# --------------------------------------------------------------------------- level table


def test_level_table_has_agentgym_levels_registered_in_minigrid() -> None:
    assert len(LEVELS) == 40 and len(set(LEVELS)) == 40
    assert LEVELS[:3] == ("GoToRedBallGrey", "GoToRedBall", "GoToRedBallNoDists")
    assert LEVELS[-1] == "BossLevelNoUnlock"
    missing = [level for level in LEVELS if gym_id(level) not in gymnasium.registry]
    assert missing == []


@pytest.mark.parametrize(
    ("task_id", "level", "seed"),
    [
        (0, "GoToRedBallGrey", 0),
        (1, "GoToRedBall", 0),
        (41, "GoToRedBall", 1),
        (39, "BossLevelNoUnlock", 0),
        (40 * 7 + 25, "KeyInBox", 7),
        (40 * 1234 + 3, "GoToObjS6", 1234),
    ],
)
def test_task_id_maps_to_level_and_seed(env: BabyAIEnv, task_id: int, level: str, seed: int) -> None:
    obs = env.reset(task_id)
    assert (obs.info["level"], obs.info["seed"]) == (level, seed)
    result = env.step("Action: check available actions")
    assert (result.info["level"], result.info["seed"]) == (level, seed)


def test_reset_is_deterministic(env: BabyAIEnv) -> None:
    first = env.reset(45).text
    env.step("Action: turn left")
    assert env.reset(45).text == first
    assert BabyAIEnv().reset(45).text == first


# -------------------------------------------------------------------------------- splits


def test_splits_are_disjoint_deterministic_and_ordered() -> None:
    env = BabyAIEnv()
    test, train = list(env.tasks("test")), list(env.tasks("train"))
    assert test == list(range(120))
    assert train == list(range(120, 40 * 1003))
    assert not set(test) & set(train)
    assert list(BabyAIEnv().tasks("train")) == train


def test_splits_follow_test_seeds_and_levels() -> None:
    env = BabyAIEnv(levels=["GoToRedBall", "BossLevel"], test_seeds=2)
    assert list(env.tasks("test")) == [1, 38, 41, 78]
    train = list(env.tasks("train"))
    assert train[:2] == [81, 118] and len(train) == 2000
    assert {LEVELS[i % 40] for i in train} == {"GoToRedBall", "BossLevel"}
    assert min(i // 40 for i in train) == 2


def test_unknown_split_names_valid_splits() -> None:
    with pytest.raises(EnvError, match="train, test"):
        BabyAIEnv().tasks("validation")


# --------------------------------------------------------------------------- observations


def test_reset_observation_format(env: BabyAIEnv) -> None:
    text = env.reset(41).text
    assert text.startswith("Your goal: go to the red ball\n")
    assert "\nAvailable actions: [" in text
    actions = available(text)
    assert actions[:2] == ["turn left", "turn right"] and actions[-1] == "check available actions"
    assert "You are not carrying anything." in text


def test_mission_sequencing_words_are_rewritten(env: BabyAIEnv) -> None:
    # Task 15 is OpenDoorsOrderN4Debug seed 0: "open the purple door after you open the red door".
    assert env.reset(15).text.startswith("Your goal: open the purple door and open the red door\n")


def test_macro_actions_move_pick_up_and_drop(env: BabyAIEnv) -> None:
    env.reset(41)
    result = env.step("Thought: the key is close.\nAction: go to green key 1")
    assert result.info["action_valid"] and result.info["primitive_steps"] == 4
    assert "There is a green key 1 right in front of you 1 steps away." in result.observation
    result = env.step("Action: pickup green key 1")
    assert "You are carrying a green key." in result.observation
    assert "drop" in available(result.observation)
    result = env.step("Action: drop")
    assert "You are not carrying anything." in result.observation
    assert result.info["primitive_steps"] == 6


def test_check_available_actions_takes_no_step(env: BabyAIEnv) -> None:
    obs = env.reset(0)
    result = env.step("Action: check available actions")
    assert result.observation.startswith("You can take the following actions: turn left, turn right")
    assert result.info["action_valid"] and result.info["primitive_steps"] == 0
    assert available(result.observation) == available(obs.text)


@pytest.mark.parametrize(
    ("action", "message"),
    [
        ("drop", "You cannot drop the object, as you are not carrying anything."),
        ("fly to the moon", NOT_RECOGNIZED),
        ("go to red ball 7", NOT_RECOGNIZED),
    ],
)
def test_unavailable_actions_explain_why(env: BabyAIEnv, action: str, message: str) -> None:
    env.reset(41)
    result = env.step(f"Action: {action}")
    assert result.observation.startswith(message)
    assert not result.info["action_valid"] and result.reward == 0.0 and not result.done
    assert result.info["primitive_steps"] == 0


def test_render_frame_is_an_rgb_frame(env: BabyAIEnv) -> None:
    env.reset(0)
    frame = env.render_frame()
    assert frame.ndim == 3 and frame.shape[2] == 3 and frame.dtype == np.uint8


def test_instruction_states_the_reply_format(env: BabyAIEnv) -> None:
    assert "Thought: " in env.instruction and "Action: " in env.instruction
    assert len(env.instruction.split()) <= 120


# -------------------------------------------------------------------------------- oracle


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("level", LEVELS[:5])
def test_oracle_solves_first_levels(level: str, seed: int) -> None:
    env = BabyAIEnv(test_seeds=4, levels=[level])
    task_id = seed * 40 + LEVELS.index(level)
    assert task_id in env.tasks("test")
    obs = env.reset(task_id)
    result = None
    for _ in range(64):
        action = env.oracle_action()
        assert action in available(result.observation if result else obs.text)
        result = env.step(f"Action: {action}")
        assert result.info["action_valid"]
        if result.done:
            break
    assert result is not None and result.done and result.info["success"]
    assert 0.0 < result.reward <= 1.0
    assert result.observation.split("\nAvailable actions: ")[0].endswith("The task is completed.")


def test_oracle_episode_stays_in_sync_after_multi_primitive_actions(env: BabyAIEnv) -> None:
    env.reset(41)
    env.step("Action: go to green key 1")  # four primitives the bot did not choose
    env.step("Action: pickup green key 1")
    for _ in range(64):
        result = env.step(f"Action: {env.oracle_action()}")
        if result.done:
            break
    assert result.info["success"]


def test_oracle_episode_returns_the_actions(env: BabyAIEnv) -> None:
    actions = env.oracle_episode(18)  # PickupLoc seed 0
    assert actions and all(isinstance(action, str) for action in actions)
    assert actions[-1].startswith("pickup ")
    with pytest.raises(EnvError, match="episode is over"):
        env.oracle_action()


# ------------------------------------------------------------------------ robustness


def test_random_policy_never_raises(env: BabyAIEnv) -> None:
    rng = random.Random(1234)
    garbage = [
        "",
        "turn left",  # no "Action:" line
        "Action:",
        "Action: dance",
        "Action: pickup purple box 99",
        "Action: 向前走 🚶 ünïcödé",
        "Thought: İstanbul\nAction: İ",
        "x" * 1_000_000,
        "Action: " + "go to " * 200_000,
        "\x00\x01Action:\x00",
    ]
    task_ids = iter([2, 11, 23, 38, 61, 95])
    obs = env.reset(next(task_ids))
    actions = available(obs.text)
    for _ in range(30):
        if rng.random() < 0.6:
            choice = rng.choice(actions)
            text = f"Thought: trying {choice}.\nAction: {choice}"
        else:
            choice, text = None, rng.choice(garbage)
        result = env.step(text)
        assert isinstance(result, StepResult)
        assert result.info["action_valid"] == (choice is not None)
        if result.info["action_valid"]:
            actions = available(result.observation)
        if result.done:
            actions = available(env.reset(next(task_ids)).text)


def test_agent_deviations_never_break_the_oracle_interface(env: BabyAIEnv) -> None:
    rng = random.Random(7)
    env.reset(27)  # BlockedUnlockPickup: doors, keys and blockers
    for _ in range(30):
        action = rng.choice(env.available_actions)
        result = env.step(f"Action: {action}")
        if result.done:
            break
        try:
            assert env.oracle_action() in env.available_actions
        except EnvError as error:
            assert "bot" in str(error)


# ------------------------------------------------------------------------------ parsing


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Thought: go left.\nAction: turn left", "turn left"),
        ("action: Turn Left.", "turn left"),
        ('ACTION: "go to red ball 1"', "go to red ball 1"),
        ("Action: 'pickup  red key 1'.\n", "pickup red key 1"),
        ("Action: turn left\nThought: no, Action: move forward\nmore text", "move forward"),
        ("Thought: hmm\nAction:\n  drop  \n", "drop"),
        ("Action: `toggle`", "toggle"),
    ],
)
def test_parse_action(env: BabyAIEnv, text: str, expected: str) -> None:
    assert env.parse_action(text) == expected


@pytest.mark.parametrize("text", ["", "turn left", "Thought: no action", "Action:", "Action:  \n\n", 'Action: "".'])
def test_parse_action_without_action(env: BabyAIEnv, text: str) -> None:
    assert env.parse_action(text) == InvalidAction(reason=NO_ACTION_FOUND)


def test_unparseable_reply_is_an_invalid_step(env: BabyAIEnv) -> None:
    env.reset(0)
    result = env.step("I will turn left")
    assert result.observation.startswith(NO_ACTION_FOUND)
    assert not result.info["action_valid"] and not result.done and result.reward == 0.0


# -------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"levels": ["GoToRedBall", "NoSuchLevel"]}, "NoSuchLevel"),
        ({"levels": []}, "levels"),
        ({"max_steps": -1}, "max_steps"),
        ({"test_seeds": 0}, "test_seeds"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_bad_options_raise_validation_errors(options: dict, named: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=named):
        BabyAIEnv(**options)


def test_unknown_level_lists_valid_levels() -> None:
    with pytest.raises(ValueError, match="valid levels: GoToRedBallGrey, GoToRedBall"):
        BabyAIEnv(levels=["Nope"])


@pytest.mark.parametrize(
    ("task_id", "message"),
    [
        (-1, "non-negative"),
        ("3", "integer"),
        (2.0, "integer"),
        (True, "integer"),
        (40 * 5 + 1, "not among the configured levels: GoToRedBallGrey"),
    ],
)
def test_bad_task_ids_raise_env_error(task_id: object, message: str) -> None:
    env = BabyAIEnv(levels=["GoToRedBallGrey"])
    with pytest.raises(EnvError, match=message):
        env.reset(task_id)


def test_step_before_reset_raises() -> None:
    with pytest.raises(EnvError, match="reset"):
        BabyAIEnv().step("Action: turn left")


def test_step_after_done_raises(env: BabyAIEnv) -> None:
    env.oracle_episode(0)
    with pytest.raises(EnvError, match="episode is over; call reset"):
        env.step("Action: turn left")


def test_max_steps_ends_the_episode_without_success() -> None:
    env = BabyAIEnv(max_steps=3)
    env.reset(41)
    result = env.step("Action: go to green key 1")  # four primitives, cut after three
    assert result.done and not result.info["success"] and result.info["primitive_steps"] == 3
    assert "step limit" in result.observation
    with pytest.raises(EnvError, match="episode is over"):
        env.step("Action: turn left")


def test_oracle_off_plays_the_same_episode_without_the_bot():
    with_bot = BabyAIEnv(levels=["GoToRedBall"])
    without = BabyAIEnv(levels=["GoToRedBall"], oracle=False)
    task = with_bot.tasks("test")[0]
    assert with_bot.reset(task).text == without.reset(task).text
    for action in ["Action: turn left", "Action: move forward", "Action: turn right"]:
        assert with_bot.step(action).observation == without.step(action).observation
    with pytest.raises(EnvError, match="oracle is off"):
        without.oracle_action()

"""SciWorld: AgentGym's id table, splits, scoring, the gold-path oracle, robustness and the JVM lifecycle.

One env (one JVM) is shared by the module; the oracle test replays 20 gold paths and is slow.
"""

from __future__ import annotations

import random
from importlib.metadata import version
from pathlib import Path

import pydantic
import pytest

from agentgym_rl.envs import registry
from agentgym_rl.envs.base import EnvError, InvalidAction, StepResult
from agentgym_rl.envs.sciworld import NO_ACTION_FOUND, SciWorldEnv


@pytest.fixture(scope="module")
def env() -> SciWorldEnv:
    environment = SciWorldEnv()
    yield environment
    environment.close()


def play(env: SciWorldEnv, task_id: int, actions: list[str]) -> list[StepResult]:
    env.reset(task_id)
    results = []
    for action in actions:
        results.append(env.step(f"Thought: next.\nAction: {action}"))
        if results[-1].done:
            break
    return results


# ------------------------------------------------------------------------------ task ids


def test_id_table_matches_agentgym(env: SciWorldEnv) -> None:
    assert version("scienceworld") == "1.2.3"
    table = env.task_table()
    assert sum(count for _, _, count in table) == 4639
    assert table[:3] == [("boil", 0, 30), ("melt", 30, 30), ("freeze", 60, 30)]
    names = [name for name, _, _ in table]
    skipped = {"grow-plant", "grow-fruit", "inclined-plane-determine-angle", "mendelian-genetics-known-plant"}
    assert len(names) == 23 and not skipped & set(names)
    assert names[-1] == "identify-life-stages-2"
    assert env.locate(0) == ("boil", 0) and env.locate(31) == ("melt", 1) and env.locate(4638)[0] == names[-1]


def test_splits_are_seeded_disjoint_and_spread_over_tasks(env: SciWorldEnv) -> None:
    test, train = list(env.tasks("test")), list(env.tasks("train"))
    assert len(test) == 200 and test == sorted(test)
    assert sorted(test + train) == list(range(4639))
    tasks = {env.locate(task_id)[0] for task_id in test}
    assert len(tasks) == 23
    assert list(env.tasks("test")) == test
    with pytest.raises(EnvError, match="valid splits: train, test"):
        env.tasks("dev")


def test_registered_as_sciworld() -> None:
    assert registry.env_class("sciworld") is SciWorldEnv


# ----------------------------------------------------------------------------- episodes


def test_reset_shows_task_and_room(env: SciWorldEnv) -> None:
    obs = env.reset(0)
    assert obs.text.startswith("Your task is to boil water.")
    assert "This room is called the" in obs.text
    description = obs.info.pop("task_description")
    assert obs.info == {"task_id": 0, "task_name": "boil", "variation": 0}
    assert obs.text.startswith(f"{description}\nThis room is called the")  # what AgentGym's /reset splits


def test_reward_is_score_change_over_100_and_success_needs_100(env: SciWorldEnv) -> None:
    task_id = 2976  # find-living-thing: a short gold path
    results = play(env, task_id, env.oracle_actions(task_id))
    scores = [r.info["score"] for r in results]
    assert sum(r.reward for r in results) == pytest.approx(scores[-1] / 100)
    assert any(0 < score < 100 for score in scores)  # partial progress ...
    assert [r.info["success"] for r in results] == [score == 100 for score in scores]  # ... is not success
    assert results[-1].done and results[-1].info["success"]
    with pytest.raises(EnvError, match="episode is over; call reset"):
        env.step("Action: look around")


# The simulator's gold path for freeze variation 11 burns the chocolate (see envs/sciworld.py).
GOLD_PATH_DEFECTS = {71}


@pytest.mark.slow
def test_oracle_reaches_score_100_on_twenty_test_ids(env: SciWorldEnv) -> None:
    test = [task_id for task_id in env.tasks("test") if task_id not in GOLD_PATH_DEFECTS]
    for task_id in test[::10]:
        results = play(env, task_id, env.oracle_actions(task_id))
        assert results[-1].info["score"] == 100 and results[-1].done, (task_id, env.locate(task_id))
        assert results[-1].info["success"] and results[-1].reward > 0


def test_gold_path_defect_is_partial_progress_not_success(env: SciWorldEnv) -> None:
    assert env.locate(71) == ("freeze", 11) and 71 in env.tasks("test")
    results = play(env, 71, env.oracle_actions(71))
    assert 0 < results[-1].info["score"] < 100 and not results[-1].done
    assert not any(result.info["success"] for result in results)
    assert "burned ash" in env.step("Action: look around").observation


def test_oracle_action_plays_the_gold_path_step_by_step(env: SciWorldEnv) -> None:
    with pytest.raises(EnvError, match="oracle is off"):
        env.oracle_action()
    advised = SciWorldEnv(oracle=True)
    try:
        advised.reset(489)  # measure-melting-point-unknown-substance: gold actions name "substance B"
        for _ in range(100):
            action = advised.oracle_action()
            assert advised.parse_action(f"Action: {action}") == action
            result = advised.step(f"Action: {action}")
            if result.done:
                break
        assert result.info["success"] and result.info["score"] == 100
        with pytest.raises(EnvError, match="call reset"):
            advised.oracle_action()
    finally:
        advised.close()


def test_unknown_commands_come_back_as_observations(env: SciWorldEnv) -> None:
    env.reset(0)
    result = env.step("Action: fly to the moon")
    assert result.observation.startswith("No known action matches that input.")
    assert not result.info["action_valid"] and not result.done and result.reward == 0.0


def test_random_policy_never_raises(env: SciWorldEnv) -> None:
    rng = random.Random(11)
    valid = ["look around", "inventory", "open door to kitchen", "go to kitchen", "look at thermometer", "wait1"]
    garbage = ["", "look around", "Action:", "Action: " + "x" * 1_000_000, "\udcff", "\x00\xff", "Action: \x00\xff"]
    garbage += ["Action: \udcff", "Action: 温度计 🌡"]
    env.reset(438)
    for _ in range(20):
        use_valid = rng.random() < 0.5
        result = env.step(f"Action: {rng.choice(valid)}" if use_valid else rng.choice(garbage))
        assert isinstance(result, StepResult) and result.observation
        if not use_valid:
            assert not result.info["action_valid"]
        if result.done:
            env.reset(438)


@pytest.mark.parametrize("text", ["", "look around", "Action:", "Action:  \n"])
def test_parse_without_action(env: SciWorldEnv, text: str) -> None:
    assert env.parse_action(text) == InvalidAction(reason=NO_ACTION_FOUND)


def test_max_steps_ends_the_episode_without_success() -> None:
    env = SciWorldEnv(max_steps=2)
    try:
        env.reset(0)
        assert not env.step("Action: look around").done
        result = env.step("Action: look around")
        assert result.done and not result.info["success"] and "episode is over" in result.observation
    finally:
        env.close()


# -------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("task_id", "message"), [(4639, "out of range; SciWorld has ids 0..4638"), (-1, "out of range"), ("0", "integer")]
)
def test_bad_task_ids_raise(env: SciWorldEnv, task_id: object, message: str) -> None:
    with pytest.raises(EnvError, match=message):
        env.reset(task_id)
    with pytest.raises(EnvError, match=message):
        env.oracle_actions(task_id)


def test_missing_java_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(EnvError, match="SciWorld needs Java"):
        SciWorldEnv()


def test_closed_env_refuses_work() -> None:
    env = SciWorldEnv()
    with pytest.raises(EnvError, match="call reset first"):
        env.step("Action: look around")
    env.close()
    env.close()
    with pytest.raises(EnvError, match="closed"):
        env.reset(0)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"max_steps": -1}, "max_steps"),
        ({"simplifications": "openDoors,fly"}, "valid: teleportAction"),
        ({"seed": 1}, "seed"),
    ],
)
def test_bad_options_raise(options: dict, named: str) -> None:
    with pytest.raises(pydantic.ValidationError, match=named):
        SciWorldEnv(**options)

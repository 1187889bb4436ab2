"""The held-out tasks without Ray: which tasks, at which horizon, when, and the config checks (playing them on
the run's samplers is tests/e2e/test_first_run.py)."""

import pytest
import structlog

from agentgym_rl.configs import load_config
from agentgym_rl.driver.errors import TrainError
from agentgym_rl.driver.heldout import HeldOutTasks
from agentgym_rl.driver.samplers import SamplerGroup

BABYAI = ["env.name=babyai", "env.options.levels=[GoToRedBallGrey, GoToRedBall]", "env.options.test_seeds=10"]


def held_out(overrides: list[str]) -> HeldOutTasks:
    config = load_config(None, overrides)
    return HeldOutTasks(config, SamplerGroup(config))


def test_held_out_tasks_are_evenly_spaced_test_tasks_at_the_largest_horizon_every_n_iterations():
    heldout = held_out(
        [*BABYAI, "trainer.heldout_tasks=4", "trainer.heldout_every=3", "curriculum.schedule=stepwise"]
        + ["curriculum.horizons=[2, 5, 9]"]
    )
    # the test split: seeds 0-9 of both levels, ids 40 * seed + level index, ascending (20 tasks)
    assert heldout.tasks == [[0, 81, 200, 281]]  # tasks 0, 5, 10 and 15 of 20
    assert heldout.horizons == [9]
    assert [i for i in range(10) if heldout.due(i)] == [0, 3, 6, 9]
    assert held_out([*BABYAI, "trainer.heldout_tasks=4"]).tasks == heldout.tasks  # the same tasks every run


def test_held_out_tasks_off_reads_no_env_and_is_never_due():
    heldout = held_out(["env.name=babyai", "trainer.heldout_tasks=0"])
    assert heldout.tasks == []
    assert not any(heldout.due(i) for i in range(5))
    assert heldout.play(0, None) == {}
    assert heldout.status() == ""


def test_a_mix_shares_the_held_out_tasks_by_weight_each_env_at_its_own_largest_horizon():
    heldout = held_out(
        [
            "trainer.heldout_tasks=3",
            "curriculum.schedule=fixed",
            "curriculum.horizon=7",
            "envs=[{name: babyai, weight: 2}, {name: textcraft, curriculum: {schedule: fixed, horizon: 3}}]",
        ]
    )
    assert [len(tasks) for tasks in heldout.tasks] == [2, 1]
    assert heldout.horizons == [7, 3]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ([*BABYAI, "trainer.heldout_tasks=21"], r"heldout_tasks gives env babyai 21 .* has 20; lower"),
        (
            ["trainer.heldout_tasks=1", "envs=[{name: babyai}, {name: textcraft}]"],
            r"heldout_tasks=1 cannot give each of the run's 2 envs",
        ),
    ],
)
def test_held_out_tasks_the_envs_cannot_give_are_refused(overrides: list[str], message: str):
    with pytest.raises(TrainError, match=message):
        held_out(overrides)


def test_a_run_without_samplers_reads_no_held_out_task_and_says_so():
    config = load_config(None, ["trainer.mode=offline", "trainer.heldout_tasks=4", "data.files=[x.jsonl]"])
    with structlog.testing.capture_logs() as logs:
        heldout = HeldOutTasks(config, SamplerGroup(config), plays_episodes=False)
    assert heldout.tasks == [] and not heldout.due(0)
    assert [(log["event"], log["mode"]) for log in logs] == [
        ("no held-out tasks: this mode plays no episodes", "offline")
    ]

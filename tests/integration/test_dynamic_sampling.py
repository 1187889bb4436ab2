"""Dynamic sampling on local Ray: an iteration keeps drawing tasks until it has its informative groups
(their episodes' rewards differ) or has drawn `max_extra_tasks` more, and says so in its metrics."""

import json
from pathlib import Path

import pytest

from agentgym_rl.driver.modes.sync import SyncTrainer
from agentgym_rl.driver.run import prepare_run
from tests.factories import RECIPE

TASKS, GROUP, EXTRA = 2, 4, 4
SETTINGS = [
    "env.name=target-word",
    "env.options={turns: 2, choices: 4}",
    "warm_start.iterations=0",
    "curriculum.schedule=fixed",
    "curriculum.horizon=2",
    "sampler.envs_per_sampler=8",
    "sampler.max_batch_size=16",
    "sampler.max_context_tokens=1024",
    "sampler.sampling.max_new_tokens=8",
    f"algorithm.group_size={GROUP}",
    "algorithm.kl_coef=0",
    "learner.num_cpus=0.5",
    "learner.gradient_checkpointing=false",
    f"trainer.tasks_per_iteration={TASKS}",
    "trainer.iterations=2",
    "trainer.checkpoint_every=100",
    "trainer.dynamic_sampling.enabled=true",
    f"trainer.dynamic_sampling.max_extra_tasks={EXTRA}",
    "logging.progress=false",
]


def train(tmp_path: Path, model: str) -> list[dict]:
    config, run_dir = prepare_run(
        RECIPE, [*SETTINGS, f"model.name={model}", f"run.dir={tmp_path}", "run.name=ds"], None
    )
    trainer = SyncTrainer(config, run_dir)
    try:
        trainer.run()
    finally:
        trainer.stop_actors()
    return [json.loads(line) for line in run_dir.metrics.read_text().splitlines()]


def episodes(tmp_path: Path, iteration: int) -> list[dict]:
    path = tmp_path / "ds" / "trajectories" / f"iter_{iteration:06d}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def check_bookkeeping(tmp_path: Path, record: dict) -> int:
    """The metrics agree with the episodes played; returns the iteration's informative groups."""
    played = episodes(tmp_path, record["iteration"])
    groups = {e["group"] for e in played}
    assert record["rollout/extra_tasks"] <= EXTRA
    assert len(groups) == record["rollout/groups"] == TASKS + record["rollout/extra_tasks"]
    assert record["rollout/episodes"] == len(played) == GROUP * len(groups)
    informative = len(groups) - record["rollout/groups_skipped"]
    assert record.get("learner/trajectories", 0.0) == GROUP * informative
    # every task is a fresh seed stream: no two groups of the iteration share their episode seeds
    assert len({e["task_id"] for e in played}) == len(groups)
    return int(informative)


@pytest.mark.slow
@pytest.mark.ci
def test_an_iteration_without_signal_stops_at_the_bound_and_trains_on_nothing(tmp_path: Path, ray_local):
    records = train(tmp_path, "tiny-random")  # it never names the target: every group is uniform
    for record in records:
        assert check_bookkeeping(tmp_path, record) == 0
        assert record["rollout/extra_tasks"] == EXTRA and record["rollout/groups_skipped"] == TASKS + EXTRA
        assert record["learner/optimizer_steps"] == 0 and record["weights_version"] == 0


@pytest.mark.slow  # SmolLM2's updates: in the slow tier's rotation (the bound's test above stays in CI)
def test_an_iteration_refills_until_it_has_its_informative_groups(tmp_path: Path, ray_local):
    records = train(tmp_path, "smollm2-135m-instruct")  # names the target in about one turn of five
    for record in records:
        informative = check_bookkeeping(tmp_path, record)
        assert informative == TASKS or record["rollout/extra_tasks"] == EXTRA
    assert any(check_bookkeeping(tmp_path, r) == TASKS for r in records)
    assert records[-1]["weights_version"] >= 1

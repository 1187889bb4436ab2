"""Offline mode through the one trainer loop: checkpoint retention, the learner's resources and W&B, as in
every other mode (each was skipped by offline mode's own loop before)."""

from pathlib import Path

import pytest
import ray

from agentgym_rl.actors.rundir import RunDir
from agentgym_rl.configs import Config
from agentgym_rl.driver.run import MODES
from tests.integration.test_wandb import history, wandb_records
from tests.unit.driver.test_data import LEVELS, oracle_episodes

NODE = "node:127.0.0.1"  # a resource Ray gives every node on this address, so the learner can be placed


def test_offline_mode_prunes_checkpoints_places_its_learner_and_tracks(ray_local, tmp_path: Path, tokenizer):
    logged = RunDir(tmp_path / "logged")
    logged.trajectories.mkdir(parents=True)
    logged.write_trajectories(0, oracle_episodes(tokenizer, tasks=2, horizons=(30,)))
    config = Config.model_validate(
        {
            "run": {"dir": str(tmp_path / "runs"), "name": "offline", "seed": 0},
            "model": {"name": "tiny-random"},
            "env": {"name": "babyai", "options": LEVELS},
            "algorithm": {"name": "sft", "group_size": 1},
            "learner": {"lr": 1e-3, "micro_batch_size": 2, "num_cpus": 0.5, "resources": {NODE: 0.01}},
            "trainer": {
                "mode": "offline",
                "iterations": 3,
                "tasks_per_iteration": 1,
                "checkpoint_every": 1,
                "keep_checkpoints": 1,
            },
            "data": {"files": [str(logged.path)]},
            "logging": {"progress": False, "wandb": {"enabled": True, "mode": "offline"}},
        }
    )
    run_dir = RunDir(tmp_path / "runs" / "offline")
    run_dir.create(config)
    trainer = MODES["offline"](config, run_dir)
    try:
        last = trainer.run().last
        # the live learner holds its share of the node's resource
        assert ray.available_resources()[NODE] == pytest.approx(ray.cluster_resources()[NODE] - 0.01)
    finally:
        trainer.stop_actors()

    assert last["iteration"] == 2 and last["learner/trajectories"] == 1
    assert sorted(p.name for p in run_dir.checkpoints.glob("iter_*")) == ["iter_000003"]
    (log,) = (run_dir.path / "wandb").glob("offline-run-*/run-*.wandb")
    assert [row["_step"] for row in history(wandb_records(log))] == [0, 1, 2]

"""A learner that dies before the run saved any checkpoint ends the run with a clear message, not a hang."""

import pytest

from agentgym_rl.actors.rundir import RunDir
from agentgym_rl.configs import load_config
from agentgym_rl.driver.errors import TrainError
from agentgym_rl.driver.modes.sync import SyncTrainer
from tests.factories import RECIPE
from tests.integration.test_cluster import TINY, run_and_kill_learner


@pytest.mark.slow
def test_a_learner_dead_before_any_checkpoint_ends_the_run_saying_so(ray_local, tmp_path):
    settings = [
        *TINY,
        "sampler.envs_per_sampler=2",
        "sampler.num_cpus=0.25",
        "learner.num_cpus=0.5",
        "trainer.iterations=3",
        "trainer.checkpoint_every=10",
        f"run.dir={tmp_path}",
        "run.name=dead",
    ]
    config = load_config(RECIPE, settings)
    run_dir = RunDir(tmp_path / "dead")
    run_dir.create(config)
    trainer = SyncTrainer(config, run_dir)
    outcome = run_and_kill_learner(trainer, when=lambda: trainer.run_dir.read_metrics())
    assert isinstance(outcome.get("error"), TrainError), outcome
    assert "learner actor died" in str(outcome["error"])
    assert "no checkpoint was saved yet" in str(outcome["error"])

"""A learner that dies mid-run ends the run with a clear message instead of hanging."""

import pytest
import ray
from agentgym_rl.actors.rundir import RunDir
from agentgym_rl.actors.sampler import EpisodeRequest
from agentgym_rl.configs import load_config
from agentgym_rl.driver.errors import TrainError
from agentgym_rl.driver.trainer import Trainer


def test_dead_learner_raises_a_train_error(ray_local, tmp_path):
    config = load_config(
        None,
        [
            "model.name=tiny-random",
            "sampler.envs_per_sampler=1",
            "sampler.num_cpus=0.25",
            "learner.num_cpus=0.25",
            "sampler.sampling.max_new_tokens=8",
            "curriculum.horizons=[1]",
            f"run.dir={tmp_path}",
            "run.name=dead",
        ],
    )
    run_dir = RunDir(tmp_path / "dead")
    run_dir.create(config)
    trainer = Trainer(config, run_dir)
    trainer._start_actors()
    try:
        refs = ray.get(trainer.samplers[0].collect.remote([EpisodeRequest(task_id=1, group=0, seed=0)]))
        ray.kill(trainer.learner, no_restart=True)
        with pytest.raises(TrainError, match="learner actor died.*no checkpoint"):
            trainer._update(refs)
    finally:
        for handle in [*trainer.samplers, trainer.curriculum]:
            ray.kill(handle)

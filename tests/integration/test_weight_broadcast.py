"""A run whose weights reach its samplers by broadcast (``trainer.weight_sync.method=broadcast``, gloo on
the CPU): every sampler holds the learner's version after each iteration, and the serving endpoint and
samplers outside the group still read the object store."""

import json

import ray

from agentgym_rl.driver.modes.sync import SyncTrainer
from agentgym_rl.driver.run import prepare_run
from tests.factories import RECIPE
from tests.integration.test_cluster import TINY


def test_a_broadcast_run_keeps_every_sampler_on_the_learners_version(ray_local, tmp_path):
    settings = [
        *TINY,
        "sampler.count=2",
        "sampler.envs_per_sampler=1",
        "sampler.num_cpus=0.25",
        "learner.num_cpus=0.5",
        "trainer.iterations=2",
        "trainer.weight_sync.method=broadcast",
        "trainer.weight_sync.bucket_mb=0.5",
        f"run.dir={tmp_path}",
        "run.name=broadcast",
    ]
    config, run_dir = prepare_run(RECIPE, settings, None)
    trainer = SyncTrainer(config, run_dir)
    try:
        trainer.run()
        states = ray.get([sampler.state.remote() for sampler in trainer.samplers])
        published = ray.get(ray.get([lr.publish_weights.remote() for lr in trainer.learners])[0][0])
    finally:
        trainer.stop_actors()
    assert len(states) == 2
    assert published.version == 2  # one optimizer step per iteration
    assert [state["weights_version"] for state in states] == [published.version] * 2
    records = [json.loads(line) for line in run_dir.metrics.read_text().splitlines()]
    # each iteration's version went out whole: the bytes of the object store's copy of the same weights
    assert [record["sync/bytes"] for record in records] == [published.num_bytes] * 2
    assert trainer.weight_group_members is not None  # the group formed once and was not given up

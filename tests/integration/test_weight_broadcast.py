"""A run whose weights reach its samplers by broadcast (``trainer.weight_sync.method=broadcast``, gloo on
the CPU): every sampler holds the learner's version after each iteration, and the serving endpoint and
samplers outside the group still read the object store."""

import json
from pathlib import Path

import ray

from agentgym_rl.driver.modes.sync import SyncTrainer
from agentgym_rl.driver.run import prepare_run
from agentgym_rl.driver.samplers.transports import CudaIpc
from tests.factories import RECIPE
from tests.integration.test_cluster import TINY
from tests.unit.learner.helpers import batch_of


def broadcast_trainer(runs: Path, *settings: str) -> SyncTrainer:
    """A tiny run with two samplers whose weights go by broadcast, with ``settings`` on top."""
    base = [
        *TINY,
        "sampler.count=2",
        "sampler.envs_per_sampler=1",
        "sampler.num_cpus=0.25",
        "learner.num_cpus=0.5",
        "trainer.weight_sync.method=broadcast",
        f"run.dir={runs}",
    ]
    config, run = prepare_run(RECIPE, [*base, *settings], None)
    return SyncTrainer(config, run)


def test_a_broadcast_run_keeps_every_sampler_on_the_learners_version(ray_local, tmp_path):
    trainer = broadcast_trainer(tmp_path, "trainer.iterations=2", "trainer.weight_sync.bucket_mb=0.5")
    run_dir = trainer.run_dir
    try:
        trainer.run()
        states = ray.get([sampler.state.remote() for sampler in trainer.samplers.samplers])
        published = ray.get(
            ray.get([learner.publish_weights.remote() for learner in trainer.learner_group.actors])[0][0]
        )
    finally:
        trainer.stop_actors()
    assert len(states) == 2
    assert published.version == 2  # one optimizer step per iteration
    assert [state["weights_version"] for state in states] == [published.version] * 2
    records = [json.loads(line) for line in run_dir.metrics.read_text().splitlines()]
    # each iteration's version went out whole: the bytes of the object store's copy of the same weights
    assert [record["sync/bytes"] for record in records] == [published.num_bytes] * 2
    transport = trainer.samplers.transport
    assert transport is not None  # the group formed once and was not given up
    assert (transport.name, transport.backend) == ("broadcast", "gloo")  # chosen from the ends' devices: all CPUs


def test_a_failed_sync_leaves_the_learner_alive_and_that_version_goes_through_the_object_store(ray_local, tmp_path):
    trainer = broadcast_trainer(tmp_path, "trainer.weight_sync.timeout_s=5")
    try:
        trainer.start_actors()
        trainer.sync_weights(0)
        assert trainer.samplers.transport.backend == "gloo"
        survivor, lost = trainer.samplers.samplers

        # A receiver dies with the group formed: the learner's broadcast fails, and the learner goes on.
        ray.kill(lost)
        ray.get(trainer.learner_group.rank0.update_batch.remote(batch_of(seed=1)))
        trainer.sync_weights(1)
        assert ray.get(trainer.learner_group.rank0.describe.remote())["device"] == "cpu"  # alive, and answering
        published = ray.get(ray.get(trainer.learner_group.rank0.publish_weights.remote())[0])
        assert published.version == 1
        assert trainer.samplers.samplers == [survivor]
        assert ray.get(survivor.state.remote())["weights_version"] == trainer.weights_version == 1
        assert (
            trainer.learner_group.payload is not None and trainer.sent_bytes == published.num_bytes
        )  # the object store's copy
        assert trainer.samplers.transport is None  # chosen and formed again at the next sync
        assert trainer.samplers.metrics(1)["pool/samplers_lost"] == 1

        # A CUDA IPC sync that cannot share (these weights are on the CPU) takes the same way out.
        ray.get(trainer.learner_group.rank0.update_batch.remote(batch_of(seed=2)))
        sync = trainer.config.trainer.weight_sync
        trainer.samplers.transport = CudaIpc(trainer.learner_group, [survivor], sync, adapter=False)
        trainer.sync_weights(2)
        assert ray.get(survivor.state.remote())["weights_version"] == trainer.weights_version == 2
        assert trainer.samplers.transport is None

        # The next sync forms a new group of the survivor and broadcasts again.
        trainer.sync_weights(3)
        transport = trainer.samplers.transport
        assert (transport.name, transport.backend, transport.samplers) == ("broadcast", "gloo", [survivor])
    finally:
        trainer.stop_actors()

"""Colocated mode (``trainer.placement=colocated``) on the CPU: each iteration the samplers sleep before the
learner's update, the learner brings its optimizer state in for the update and sends it back out after, and the
samplers wake before the new weights load; with the transformers engine and with vLLM's CPU build, whose sleep
and wake go through vLLM's own calls (which free nothing on a CPU)."""

import json

import pytest
import ray

from agentgym_rl.driver.modes.sync import SyncTrainer
from agentgym_rl.driver.run import prepare_run
from tests.factories import RECIPE
from tests.integration.test_cluster import TINY
from tests.unit.actors.test_engine import ENGINES

ITERATIONS = 2
# What each iteration's update does, in this order, across the sampler's and the learner's timelines.
ORDER = ["asleep", "optimizer state on the device", "update", "optimizer state offloaded", "awake", "weights loaded"]


# vLLM's CPU build takes about 3 min here beside other tests: its case is in the slow tier's rotation
COLOCATED_ENGINES = [
    engine if isinstance(engine, str) else pytest.param(*engine.values, marks=[*engine.marks, pytest.mark.slow])
    for engine in ENGINES
]


@pytest.mark.parametrize("engine", COLOCATED_ENGINES)
def test_samplers_sleep_through_the_update_and_the_optimizer_state_leaves_while_they_generate(
    engine, ray_local, tmp_path
):
    settings = [
        *TINY,
        "trainer.placement=colocated",
        f"sampler.engine={engine}",
        "sampler.vllm.enable_sleep_mode=true",
        "sampler.envs_per_sampler=1",
        "sampler.num_cpus=0.25",
        "learner.num_cpus=0.5",
        f"trainer.iterations={ITERATIONS}",
        f"run.dir={tmp_path}",
        "run.name=colocated",
    ]
    config, run_dir = prepare_run(RECIPE, settings, None)
    trainer = SyncTrainer(config, run_dir)
    try:
        trainer.run()
        events = ray.get(trainer.samplers.samplers[0].timeline.remote()) + ray.get(
            trainer.learner_group.rank0.timeline.remote()
        )
        bundle = ray.util.placement_group_table(trainer.learner_group.placement)["bundles"][0]
    finally:
        trainer.stop_actors()
    assert bundle == {"CPU": 0.75}  # the learner's 0.5 and its sampler's 0.25 in one bundle
    names = [name for _, name in sorted(events)]
    # the learner ready before its sampler starts (they share a GPU), then one round of the order per iteration,
    # nothing in between (the samplers start with the model's own weights)
    assert names == ["ready", "starting", *ORDER * ITERATIONS], names
    records = [json.loads(line) for line in run_dir.metrics.read_text().splitlines()]
    assert all(record["time/sleep_s"] >= 0 and record["time/wake_s"] >= 0 for record in records)
    assert [record["weights_version"] for record in records] == [1, 2]

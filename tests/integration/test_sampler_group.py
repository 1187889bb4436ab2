"""The sampler group on a local Ray instance: the episodes of a sampler that dies are played again, from the same
seeds, on a survivor and counted; an error raised inside a sampler ends the wait as one line."""

from __future__ import annotations

import pytest
import ray

from agentgym_rl.actors.sampler import EpisodeRequest
from agentgym_rl.configs import load_config
from agentgym_rl.driver.samplers import SamplerFailed, SamplerGroup
from tests.factories import RECIPE
from tests.integration.broken_env import MESSAGE
from tests.integration.test_cluster import TINY

SMALL = [*TINY, "sampler.envs_per_sampler=1", "sampler.num_cpus=0.25", "sampler.start_timeout_s=120"]


def requests(group: int) -> list[EpisodeRequest]:
    return [EpisodeRequest(task_id=121, group=group, seed=100 * group + k, horizon=2) for k in range(2)]


def test_a_lost_samplers_episodes_are_played_again_on_a_survivor_from_the_same_seeds(ray_local):
    samplers = SamplerGroup(load_config(RECIPE, [*SMALL, "sampler.count=2"]))
    samplers.start([samplers.config], [[1, 1]])
    try:
        first, second = samplers.samplers
        calls = {samplers.submit(requests(group)): group for group in (0, 1)}
        # The two calls went round the pool; the first sampler dies with its call in flight.
        assert [samplers.calls[call].sampler for call in calls] == [first, second]
        ray.kill(first, no_restart=True)
        played = {group: trajectories for group, _, trajectories in samplers.completed(calls, 0)}
        assert samplers.samplers == [second]
        assert samplers.calls == {}  # nothing left in flight
    finally:
        samplers.stop()
    assert sorted(played) == [0, 1]
    for group, trajectories in played.items():
        assert [(t.group, t.task_id, t.failed) for t in trajectories] == [(group, 121, False)] * 2
    metrics = samplers.metrics(0)
    assert (metrics["pool/samplers_lost"], metrics["pool/redispatched"]) == (1.0, 1.0)


def test_an_env_error_inside_a_sampler_ends_the_wait_as_one_line(ray_local):
    broken = [*SMALL, "env.name=tests.integration.broken_env:BrokenEnv", "env.options={}"]
    samplers = SamplerGroup(load_config(RECIPE, broken))
    samplers.start([samplers.config], [[1]])
    try:
        calls = {samplers.submit(requests(0)): 0}
        with pytest.raises(SamplerFailed) as failed:
            list(samplers.completed(calls, 0))
        assert samplers.calls == {}
    finally:
        samplers.stop()
    assert str(failed.value) == f"sampler 0 failed: EnvError: {MESSAGE} (task 121)"

"""Torch threads per actor on local Ray: the CPUs the actor reserved, unless its config names a count."""

from __future__ import annotations

import os

import pytest
import ray
import torch

from agentgym_rl.actors.threads import reserved_cpus, set_torch_threads


class Probe:
    def threads(self, configured: int) -> tuple[int, int]:
        """What ``set_torch_threads(configured)`` returned, and what torch computes with afterwards."""
        return set_torch_threads(configured), torch.get_num_threads()


@pytest.mark.parametrize(("num_cpus", "configured", "expected"), [(1, 0, 1), (0.5, 0, 1), (2, 0, 2), (1, 3, 3)])
def test_an_actor_gets_the_threads_of_the_cpus_it_reserved_or_those_its_config_names(
    ray_local, num_cpus, configured, expected
):
    probe = ray.remote(Probe).options(num_cpus=num_cpus).remote()
    try:
        assert ray.get(probe.threads.remote(configured)) == (expected, expected)
    finally:
        ray.kill(probe)


def test_outside_an_actor_every_core_counts(ray_local):
    assert reserved_cpus() == (os.cpu_count() or 1)

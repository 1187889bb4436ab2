"""Torch threads per actor: on a GPU the CPUs the actor reserved, on a CPU-only node every core, unless its config
names a count; ``AGENTGYM_RL_TORCH_THREADS`` caps the default (the suite sets it to 1, see tests/conftest.py)."""

from __future__ import annotations

import os

import pytest
import ray
import torch

from agentgym_rl.actors.threads import THREADS_CAP_VAR, capped, default_threads, reserved_cpus, set_torch_threads
from agentgym_rl.driver.cli import main


class Probe:
    def threads(self, configured: int) -> tuple[int, int, float | None]:
        """What ``set_torch_threads(configured)`` returned, what torch computes with afterwards, and the CPUs
        Ray reserved for this actor."""
        return set_torch_threads(configured), torch.get_num_threads(), reserved_cpus()


@pytest.mark.parametrize(
    ("reserved", "on_gpu", "expected"),
    [(1.0, True, 1), (0.5, True, 1), (2.0, True, 2), (2.4, True, 2), (1.0, False, 16), (None, True, 16)],
)
def test_a_gpu_actor_takes_its_reserved_cpus_and_a_cpu_actor_or_a_driver_every_core(reserved, on_gpu, expected):
    assert default_threads(reserved, on_gpu, cores=16) == expected


@pytest.mark.parametrize(("num_cpus", "configured"), [(1, 0), (0.5, 0), (1, 3)])
def test_an_actor_sets_the_threads_its_config_names_or_the_default_for_what_it_reserved(
    ray_local, num_cpus, configured
):
    probe = ray.remote(Probe).options(num_cpus=num_cpus).remote()
    try:
        threads, torch_threads, reserved = ray.get(probe.threads.remote(configured))
    finally:
        ray.kill(probe)
    assert reserved == num_cpus  # what Ray reports is what the actor asked for
    expected = configured or capped(default_threads(reserved, torch.cuda.is_available(), os.cpu_count() or 1))
    assert threads == torch_threads == expected
    if not configured and os.environ.get(THREADS_CAP_VAR) == "1":
        assert threads == 1  # the cap reaches the actor through Ray's worker environment


@pytest.mark.parametrize(("cap", "expected"), [(None, 16), ("", 16), ("1", 1), ("4", 4), ("32", 16)])
def test_the_cap_lowers_the_default_and_never_raises_it(monkeypatch, cap, expected):
    if cap is None:
        monkeypatch.delenv(THREADS_CAP_VAR, raising=False)
    else:
        monkeypatch.setenv(THREADS_CAP_VAR, cap)
    assert capped(16) == expected


@pytest.mark.parametrize("cap", ["0", "two", "-1", "1.5"])
def test_a_cap_that_is_not_a_positive_count_is_refused_by_name(monkeypatch, cap):
    monkeypatch.setenv(THREADS_CAP_VAR, cap)
    with pytest.raises(ValueError, match=f"{THREADS_CAP_VAR} must be a whole number of threads, at least 1"):
        capped(2)


def test_the_command_line_refuses_a_bad_cap_in_one_line_before_a_run_starts(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv(THREADS_CAP_VAR, "two")
    assert main(["train", "--set", f"run.dir={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"agentgym-rl: error: {THREADS_CAP_VAR} must be a whole number of threads, at least 1; it is 'two'"
    assert not any(tmp_path.iterdir())  # no run directory left behind


def test_outside_an_actor_nothing_is_reserved(ray_local):
    assert reserved_cpus() is None

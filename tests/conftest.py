"""Shared fixtures. Ray's loopback switch is set here, before any test module imports ray.

The suite runs three workers on two cores, each starting actors that compute with torch: one torch thread per
process (the pytest workers through ``OMP_NUM_THREADS``, every actor and replica they start through
``AGENTGYM_RL_TORCH_THREADS``), as a thread per core per process left them waiting on each other's descheduled
threads (see docs/development.md). Set either variable to run the suite otherwise.
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.pop("RAY_ADDRESS", None)
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("AGENTGYM_RL_TORCH_THREADS", "1")

import pytest

from agentgym_rl.actors.model_store import load_tokenizer
from tests.slow_shard import mark_shard

SHARD_LINE = pytest.StashKey[str]()


@pytest.fixture(scope="session")
def tokenizer():
    """The SmolLM2 tokenizer shared by both built-in models."""
    return load_tokenizer("tiny-random")


@pytest.fixture(scope="session")
def ray_local():
    """A local Ray instance on 127.0.0.1 with this machine's two CPUs, shared by the session."""
    import ray

    from agentgym_rl.actors.cluster import init_ray
    from agentgym_rl.configs import Config

    init_ray(Config.model_validate({"ray": {"num_cpus": 2}}))
    yield ray
    ray.shutdown()


def pytest_configure(config: pytest.Config) -> None:
    """pytest-xdist hands files out largest first (by test count) unless told otherwise, which would put the
    one-test file of the GRPO learning test last; the order below is the one wanted."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the slow shard's tests are selected by their marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks this run's shard of the slow tier (``tests/slow_shard.py``), then orders the files.

    Files that hold a long test of the CI tier (marked both `slow` and `ci`) run first, then files with any
    slow test, then the rest (order kept otherwise): the CI command runs the suite on three pytest-xdist workers,
    a file per worker at a time, and minutes-long files started last would leave two workers idle while the
    third finishes them. Among the first, a file whose tests were given a longer `timeout` than the default
    starts earlier (the longest, the GRPO learning test, would otherwise end the run alone)."""
    config.stash[SHARD_LINE] = mark_shard(config, items)
    if hasattr(config, "workeroutput"):  # a pytest-xdist worker: the controller prints the line
        config.workeroutput["slow_shard"] = config.stash[SHARD_LINE]
    in_ci = {item.path for item in items if item.get_closest_marker("slow") and item.get_closest_marker("ci")}
    heavy = {item.path for item in items if item.get_closest_marker("slow")}
    allowed: dict[Path, float] = {}
    for item in items:
        if marker := item.get_closest_marker("timeout"):
            allowed[item.path] = max(allowed.get(item.path, 0.0), float(marker.args[0]))
    items.sort(key=lambda item: (item.path not in in_ci, -allowed.get(item.path, 0.0), item.path not in heavy))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """pytest-xdist's controller keeps a worker's slow-shard line (every worker picks the same shard)."""
    if line := getattr(node, "workeroutput", {}).get("slow_shard"):
        node.config.stash[SHARD_LINE] = line


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """Says which shard of the slow tier ran, so a failure in it can be rerun with ``AGENTGYM_SLOW_SHARD``."""
    if line := config.stash.get(SHARD_LINE, None):
        terminalreporter.write_line(line)

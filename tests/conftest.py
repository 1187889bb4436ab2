"""Shared fixtures. Ray's loopback switch is set here, before any test module imports ray."""

from __future__ import annotations

import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.pop("RAY_ADDRESS", None)

import pytest

from agentgym_rl.actors.model_store import load_tokenizer


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

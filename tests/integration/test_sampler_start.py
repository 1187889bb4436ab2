"""A sampler pool that cannot start says why: an engine missing a package is refused before any sampler starts,
and an engine that fails inside a sampler's start-up is named with the exception it raised, not with Ray's
generic line about a dead actor."""

from __future__ import annotations

import pytest

from agentgym_rl.actors.engines import EngineSpec, EngineUnavailableError, register_engine
from agentgym_rl.configs import load_config
from agentgym_rl.driver.samplers.pool import PoolError, SamplerPool
from tests.factories import RECIPE
from tests.integration.scripted_engine import ScriptedEngine

OVERRIDES = [
    "model.name=tiny-random",
    "env.options.levels=[GoToRedBall]",
    "sampler.envs_per_sampler=1",
    "sampler.num_cpus=0.25",
    "sampler.start_timeout_s=120",
]


class UninstalledEngine(ScriptedEngine):
    """An engine whose package this machine lacks (as vLLM's engine without vllm installed)."""

    @classmethod
    def check_available(cls, setting: str) -> None:
        raise EngineUnavailableError(f"{setting} needs the package made-up-engine, which is not installed")


class FailingEngine(ScriptedEngine):
    """An engine that can be imported but refuses the model once a sampler builds it."""

    @classmethod
    def build(cls, spec: EngineSpec) -> FailingEngine:
        raise EngineUnavailableError(f"this engine runs no heads of the size {spec.model_name} has\nsecond line")


register_engine("uninstalled", UninstalledEngine)
register_engine("failing", FailingEngine)


def test_an_engine_missing_its_package_is_refused_before_any_sampler_starts(ray_local):
    pool = SamplerPool(load_config(RECIPE, [*OVERRIDES, "sampler.engine=uninstalled"]))

    with pytest.raises(PoolError) as refused:
        pool.start([1])

    assert str(refused.value) == (
        "sampler.engine='tests.integration.test_sampler_start:UninstalledEngine' needs the package made-up-engine, "
        "which is not installed"
    )
    assert pool.samplers == [] and pool.next_index == 0


def test_a_sampler_that_fails_to_start_is_named_with_what_it_raised(ray_local):
    pool = SamplerPool(load_config(RECIPE, [*OVERRIDES, "sampler.engine=failing"]))

    with pytest.raises(PoolError) as refused:
        pool.start([1])

    message = str(refused.value)
    assert message.startswith("1 of 1 sampler(s) did not start, leaving 0, below sampler.min_count=1: ")
    assert message.endswith(
        "EngineUnavailableError: this engine runs no heads of the size tiny-random has second line"
    ), message
    assert pool.samplers == []

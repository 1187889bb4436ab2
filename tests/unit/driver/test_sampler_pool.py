"""A sampler pool's arithmetic and its reading of Ray's errors; no Ray cluster."""

import pytest
import ray

from agentgym_rl.driver.samplers.group import cause_line
from agentgym_rl.driver.samplers.pool import sampler_lost, share_growth, start_wait_s


@pytest.mark.parametrize(
    ("counts", "maximum", "room", "added"),
    [
        ([2, 4, 3], 4, 3, [2, 0, 1]),
        ([1, 1], 3, 1, [1, 0]),
        ([1, 1], 3, 10, [2, 2]),  # room beyond the maximum is left unused
        ([4, 4], 4, 5, [0, 0]),
        ([], 4, 5, []),
    ],
)
def test_share_growth_fills_the_smallest_first_up_to_the_maximum(counts, maximum, room, added):
    assert share_growth(counts, maximum, room) == added


@pytest.mark.parametrize(
    ("starting", "nodes", "wait"),
    [
        (1, 1, 300.0),
        (8, 1, 2400.0),  # a colocated node's 8 engines load at once
        (8, 2, 1200.0),
        (3, 2, 600.0),  # one node starts two
        (2, 8, 300.0),
        (4, 0, 1200.0),  # no node known to hold one: as if one did
    ],
)
def test_samplers_that_start_at_once_wait_for_as_many_as_a_node_starts(starting, nodes, wait):
    assert start_wait_s(300.0, starting, nodes) == wait


def test_sampler_lost_tells_a_dead_sampler_from_an_error_inside_it():
    assert sampler_lost(ray.exceptions.ActorDiedError())
    assert sampler_lost(ray.exceptions.ActorUnavailableError("node gone", None))
    assert sampler_lost(ray.exceptions.OwnerDiedError(ray.ObjectRef.nil().hex(), "", ""))
    inside = ray.exceptions.RayTaskError("collect", "traceback", RuntimeError("no horizon"))
    assert not sampler_lost(inside)
    # A task error caused by an actor the sampler called (an env actor) is the sampler's own error.
    assert not sampler_lost(inside.as_instanceof_cause())
    assert not sampler_lost(RuntimeError("unrelated"))


def test_an_error_inside_a_sampler_reads_as_its_innermost_cause_in_one_line():
    # A sampler's collect awaited its env actor, which raised: Ray wraps the env's error twice.
    env_error = ValueError("the oracle is off; create the env with oracle: true\nsecond line")
    in_sampler = ray.exceptions.RayTaskError("EnvActor.oracle_reply", "env traceback", env_error).as_instanceof_cause()
    in_driver = ray.exceptions.RayTaskError(
        "SamplerActor.collect", "sampler traceback", in_sampler
    ).as_instanceof_cause()
    assert "sampler traceback" in str(in_driver)
    assert cause_line(in_driver) == "ValueError: the oracle is off; create the env with oracle: true"
    assert cause_line(RuntimeError("plain")) == "RuntimeError: plain"

"""The pool arithmetic (what fits where, how growth is shared) and the pool config checks; no Ray."""

import pytest
import ray

from actors.placement import clean_request, fit_count, sampler_room
from actors.pools import sampler_lost, share_growth
from configs import ConfigError, load_config


@pytest.mark.parametrize(
    ("free", "request_", "limit", "placed", "left"),
    [
        # Two nodes with 1.5 and 0.75 free CPUs hold 6 + 3 actors of 0.25 CPU.
        ([{"CPU": 1.5}, {"CPU": 0.75}], {"CPU": 0.25}, 100, 9, [0.0, 0.0]),
        # The limit stops early; copies go to the node with the most room first (spread).
        ([{"CPU": 1.0}, {"CPU": 0.5}], {"CPU": 0.25}, 3, 3, [0.25, 0.5]),
        # Room summed over nodes is not room on one node: 0.2 + 0.2 CPU fit no 0.3 CPU actor.
        ([{"CPU": 0.2}, {"CPU": 0.2}], {"CPU": 0.3}, 5, 0, [0.2, 0.2]),
        # A custom resource that only one node has decides where a sampler may go.
        ([{"CPU": 4.0}, {"CPU": 1.0, "rollout": 1.0}], {"CPU": 0.5, "rollout": 1.0}, 5, 1, [4.0, 0.5]),
        # No nodes, no room.
        ([], {"CPU": 0.05}, 5, 0, []),
    ],
)
def test_fit_count_packs_requests_into_single_nodes(free, request_, limit, placed, left):
    assert fit_count(free, request_, limit) == placed
    assert [node["CPU"] for node in free] == pytest.approx(left)


def test_fit_count_absorbs_float_round_off():
    # 0.05 twenty times is not exactly 1.0 in floating point; Ray would still place all twenty.
    assert fit_count([{"CPU": 1.0}], {"CPU": 0.05}, 100) == 20


def test_a_zero_gpu_request_does_not_rule_out_cpu_only_nodes():
    request = clean_request({"CPU": 0.5, "GPU": 0.0})
    assert request == {"CPU": 0.5}
    assert fit_count([{"CPU": 1.0}], request, 1) == 1


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


def test_sampler_lost_tells_a_dead_sampler_from_an_error_inside_it():
    assert sampler_lost(ray.exceptions.ActorDiedError())
    assert sampler_lost(ray.exceptions.ActorUnavailableError("node gone", None))
    assert sampler_lost(ray.exceptions.OwnerDiedError(ray.ObjectRef.nil().hex(), "", ""))
    inside = ray.exceptions.RayTaskError("collect", "traceback", RuntimeError("no horizon"))
    assert not sampler_lost(inside)
    # A task error caused by an actor the sampler called (an env actor) is the sampler's own error.
    assert not sampler_lost(inside.as_instanceof_cause())
    assert not sampler_lost(RuntimeError("unrelated"))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["sampler.count=2", "sampler.min_count=3"], "min_count <= count <= max_count, got 3 <= 2 <= 2"),
        (["sampler.count=3", "sampler.max_count=2"], "min_count <= count <= max_count, got 1 <= 3 <= 2"),
        (["sampler.envs_per_sampler=4", "sampler.max_envs_per_sampler=2"], "got 1 <= 4 <= 2"),
        (["sampler.envs_per_sampler=2", "sampler.min_envs_per_sampler=3"], "got 3 <= 2 <= 2"),
        (["trainer.on_learner_failure=restart", "trainer.mode=async"], "needs trainer.mode=sync"),
        (["trainer.on_learner_failure=retry"], "trainer.on_learner_failure"),
    ],
)
def test_bad_pool_and_failure_settings_are_rejected_with_the_numbers(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("<", ".").replace("=", ".")):
        load_config(None, overrides)


def test_default_pools_keep_their_start_sizes():
    config = load_config(None, ["sampler.count=2", "sampler.envs_per_sampler=3"])
    assert (config.sampler.min_count, config.sampler.count, config.sampler.max_count) == (1, 2, None)
    assert config.sampler.max_envs_per_sampler is None
    assert config.trainer.on_learner_failure == "fail"


def test_a_new_sampler_needs_room_for_its_first_env_actors_too():
    overrides = [
        "sampler.num_cpus=0.5",
        "sampler.num_gpus=0",
        "sampler.envs_per_sampler=2",
        "sampler.env_num_cpus=0.25",
    ]
    config = load_config(None, overrides)
    # 0.75 CPU holds the sampler but only one of its two env actors: no sampler fits.
    assert sampler_room([{"CPU": 0.75}], config.sampler, 1) == 0
    free = [{"CPU": 1.0}, {"CPU": 1.25}]
    assert sampler_room(free, config.sampler, 5) == 2
    assert sum(node["CPU"] for node in free) == pytest.approx(0.25)

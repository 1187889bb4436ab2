"""The pool arithmetic (what fits where) and the pool config checks; no Ray (how growth is shared among a pool's
samplers is tests/unit/driver/test_sampler_pool.py)."""

import pytest

from agentgym_rl.actors.cluster import (
    ActorNeed,
    ClusterError,
    PoolNeed,
    clean_request,
    fit_count,
    plan_actors,
    sampler_room,
)
from agentgym_rl.configs import ConfigError, load_config


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


# ------------------------------------------------------------------------ the plan before anything starts

LEARNER = ActorNeed("learner(s) (learner.count, learner.num_cpus, learner.resources)", {"CPU": 1.0}, 1)


def babyai_pool(**fields) -> PoolNeed:
    """The quickstart's pool: samplers of 0.5 CPU, each with 8 env actors of 0.05 CPU."""
    values = {"min_count": 1, "count": 1, "min_envs": 1, "envs": 8, **fields}
    return PoolNeed(env="babyai", sampler={"CPU": 0.5}, env_actor={"CPU": 0.05}, **values)


def test_the_issues_example_starts_one_sampler_with_all_its_env_actors():
    # ray.num_cpus=2, a 1-CPU learner, sampler.count=2: the second sampler would leave no room for env actors.
    assert plan_actors([{"CPU": 2.0}], [LEARNER], [babyai_pool(count=2)]) == [[8]]
    # With room for both, both start with all their env actors.
    assert plan_actors([{"CPU": 3.0}], [LEARNER], [babyai_pool(count=2)]) == [[8, 8]]


def test_a_minimum_sampler_starts_with_the_env_actors_there_is_room_for():
    # 2 - 1 - 0.5 = 0.5 CPU left: the minimum sampler's one env actor, then 9 more of 0.05 fit, capped at envs=8.
    assert plan_actors([{"CPU": 2.0}], [LEARNER], [babyai_pool(min_envs=1)]) == [[8]]
    # 1.75 - 1.5 = 0.25 CPU: 5 env actors in all.
    assert plan_actors([{"CPU": 1.75}], [LEARNER], [babyai_pool(min_envs=1)]) == [[5]]


def test_every_pools_minimum_is_reserved_before_any_pool_grows():
    pools = [babyai_pool(count=3), babyai_pool(count=3, min_envs=2)]
    # 3 CPU - learner 1 - 2 minimum samplers (0.5 + 0.05 and 0.5 + 0.1) = 0.85 left for growth.
    plans = plan_actors([{"CPU": 3.0}], [LEARNER], pools)
    assert [len(plan) for plan in plans] == [1, 1]
    assert plans[0] == [8] and 2 <= plans[1][0] <= 8


def test_a_minimum_that_cannot_fit_names_every_number():
    serve = [ActorNeed("serve replica(s) (serve.num_replicas, serve.num_cpus)", {"CPU": 0.05}, 1)]
    with pytest.raises(ClusterError) as caught:
        plan_actors([{"CPU": 1.2, "memory": 1e9}], [LEARNER, *serve], [babyai_pool(min_count=2, count=2)])
    message = str(caught.value)
    for part in (
        "1 learner(s) (learner.count, learner.num_cpus, learner.resources) x {CPU: 1}",
        "1 serve replica(s) (serve.num_replicas, serve.num_cpus) x {CPU: 0.05}",
        "2 sampler(s) of env babyai (sampler.min_count) x {CPU: 0.5}",
        "1 env actor(s) (sampler.min_envs_per_sampler) x {CPU: 0.05}",
        "In all {CPU: 2.15}",
        "1 node(s) have node 0: {CPU: 1.2}",
        "the samplers of env babyai did not fit",
        "raise ray.num_cpus",
    ):
        assert part in message, message


def test_a_custom_resource_no_node_has_fails_the_plan():
    learner = ActorNeed(
        "learner(s) (learner.count, learner.num_cpus, learner.resources)", {"CPU": 1.0, "gpu_box": 1}, 1
    )
    with pytest.raises(ClusterError, match=r"learner\(s\).*x \{CPU: 1, gpu_box: 1\} did not fit"):
        plan_actors([{"CPU": 8.0}], [learner], [babyai_pool()])

"""The Ray cluster: joining or starting it, and where actors go on it (resource requests, free room per
node, spread env actors).

Learners and samplers are placed by the resources they request (CPUs, GPUs, custom Ray resources
from the config); env actors are cheap and many, so they are spread over the nodes (Ray's
``SPREAD`` strategy) and a lost node takes only a share of them. The pools grow only into room that
exists now: ``fit_count`` packs requests into each live node's free resources, so an actor is
started only where it can be placed at once and never waits as a pending request.

Before a run starts any actor, ``plan_actors`` packs what the run needs at the least (learners, the
serve replicas, each pool's ``sampler.min_count`` samplers with ``sampler.min_envs_per_sampler`` env
actors each) into the nodes' total resources and fails at once, naming the numbers, when they do not
fit; the room left decides how many samplers, with how many env actors, each pool starts with.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import ray
from ray._private import ray_constants
from ray._private import state as ray_state
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from agentgym_rl.configs import Config
from agentgym_rl.configs.errors import AgentGymError
from agentgym_rl.configs.schema import EnvConfig, LearnerConfig, SamplerConfig
from agentgym_rl.envs.actor import EnvHost

# Ray counts resources in units of 1e-4; a smaller slack absorbs float round-off only.
EPSILON = 1e-6
# Restarts Ray grants a dead env actor (as ``envs.actor.create_env_actor`` does); the sampler still
# replaces an actor whose call failed, so these only cover deaths between episodes.
ENV_MAX_RESTARTS = 3


class ClusterError(AgentGymError):
    """A cluster that cannot host the command: a local instance that would listen on the network, or a run
    whose least actors do not fit (the message names the numbers)."""


LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def ray_address(config: Config) -> str | None:
    """The cluster a command joins (``ray.address``, else ``$RAY_ADDRESS``); None: it starts a local instance."""
    return config.ray.address or os.environ.get("RAY_ADDRESS")


def init_ray(config: Config) -> None:
    """Connect to ``ray.address`` or start a local instance that listens on 127.0.0.1 only."""
    if ray.is_initialized():
        return
    # ray.init installs its own SIGTERM handler; a command's handler (``stop_on_signals``) is put back after it.
    own = signal.getsignal(signal.SIGTERM)
    try:
        _start_ray(config)
    finally:
        if callable(own) and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, own)


def _start_ray(config: Config) -> None:
    address = ray_address(config)
    if address:
        ray.init(address=address, log_to_driver=True)
        return
    # Ray reads this switch when it is imported; with it a local instance listens on 127.0.0.1 only.
    if os.environ.get(LOOPBACK_ENV) != "0" or ray_constants.ENABLE_RAY_CLUSTER:
        raise ClusterError(
            f"a local Ray instance would listen on the network; set {LOOPBACK_ENV}=0 in the environment "
            "before Python imports ray (the agentgym-rl command does this), or set ray.address"
        )
    ray.init(
        # "local" starts a fresh instance even when other Ray instances run on this machine (ray.init()
        # alone would join the newest of them).
        address="local",
        num_cpus=config.ray.num_cpus,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        log_to_driver=True,
    )


# Ray's shutdown takes seconds; once, on a loaded 2-core machine, it did not return at all after Ctrl-C.
SHUTDOWN_GRACE_S = 60.0


class Stopped(KeyboardInterrupt):
    """SIGINT or SIGTERM asked the command to stop; it exits with ``128 + signum`` (130, 143)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


# The signals ``stop_on_signals`` received, latest last (``stopped`` reads it).
_received: list[int] = []


def stop_on_signals() -> None:
    """Make SIGINT (Ctrl-C) and SIGTERM (what Kubernetes, systemd and Slurm send) raise ``Stopped`` in the main
    thread, also where SIGINT arrives ignored: a non-interactive shell starts background jobs so, and Python
    then keeps it ignored. ``init_ray`` keeps the SIGTERM handler that Ray's start-up would replace."""

    def stop(signum: int, frame: object) -> None:
        _received.append(signum)
        raise Stopped(signum)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, stop)


def stopped(interrupt: KeyboardInterrupt) -> Stopped:
    """``interrupt`` as a ``Stopped`` naming its signal: Ray's blocking calls re-raise a plain KeyboardInterrupt
    for the ``Stopped`` a handler raised inside them, so the signal is looked up among those received."""
    if isinstance(interrupt, Stopped):
        return interrupt
    return Stopped(_received[-1] if _received else signal.SIGINT)


@contextmanager
def deadline(seconds: float, what: str, exit_code: int) -> Iterator[None]:
    """Run the block; if it is still running after ``seconds``, say so on stderr with the stack of every
    thread and end the process with ``exit_code`` (the processes of a local Ray instance end with it)."""

    def give_up() -> None:
        print(
            f"agentgym-rl: {what} did not finish within {seconds:g} s; exiting. Threads:", file=sys.stderr, flush=True
        )
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        os._exit(exit_code)

    timer = threading.Timer(seconds, give_up)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def actor_gpus(num_gpus: float | None) -> float:
    """GPUs one actor reserves under a ``num_gpus`` setting (``sampler``, ``learner``, ``serve``): the setting,
    or with None one GPU when the cluster has any, else none."""
    if num_gpus is not None:
        return num_gpus
    return 1.0 if ray.is_initialized() and ray.cluster_resources().get("GPU", 0.0) > 0 else 0.0


def sampler_request(config: SamplerConfig) -> dict[str, float]:
    """The resources one sampler actor reserves."""
    return clean_request({"CPU": config.num_cpus, "GPU": actor_gpus(config.num_gpus), **config.resources})


def learner_request(config: LearnerConfig) -> dict[str, float]:
    """The resources one learner actor reserves."""
    return clean_request({"CPU": config.num_cpus, "GPU": actor_gpus(config.num_gpus), **config.resources})


def colocated_bundle(config: Config) -> dict[str, float]:
    """One bundle of a colocated run (``trainer.placement``): a learner and its sampler, sharing the learner's GPUs."""
    learner, sampler = config.learner, config.sampler
    return clean_request(
        {
            "CPU": learner.num_cpus + sampler.num_cpus,
            "GPU": actor_gpus(learner.num_gpus),
            **learner.resources,
            **sampler.resources,
        }
    )


@dataclass(frozen=True)
class Colocation:
    """The learners' placement group in a colocated run: bundle i holds learner i and sampler i, each
    reserving ``gpus_each`` of the bundle's GPUs (half; Ray then shows both the same devices)."""

    placement: PlacementGroup
    count: int
    gpus_each: float

    def strategy(self, index: int) -> PlacementGroupSchedulingStrategy:
        return PlacementGroupSchedulingStrategy(placement_group=self.placement, placement_group_bundle_index=index)


def env_request(config: SamplerConfig) -> dict[str, float]:
    """The resources one env actor reserves."""
    return clean_request({"CPU": config.env_num_cpus})


def clean_request(request: dict[str, float]) -> dict[str, float]:
    """``request`` without zero amounts (Ray ignores them; they must not veto a node either)."""
    return {name: amount for name, amount in request.items() if amount > 0}


def free_resources_per_node() -> list[dict[str, float]]:
    """What each live node has free now, as Ray's scheduler last reported it (may lag by a moment)."""
    # A DeveloperAPI of Ray; the public ``ray.available_resources`` sums over nodes, which would
    # count room that no single node has.
    return [dict(free) for free in ray_state.available_resources_per_node().values()]


def fit_count(free: list[dict[str, float]], request: dict[str, float], limit: int) -> int:
    """How many actors that each need ``request`` on one node fit into ``free``, at most ``limit``.

    Each placed copy goes to the node with the most of the request's first resource left (spreading
    like Ray's ``SPREAD``) and is subtracted from ``free`` in place, so the caller can fit the next
    kind of actor into what is left.

    Args:
        free: free resources per node, e.g. ``[{"CPU": 1.5, "GPU": 1.0}, {"CPU": 0.75}]``.
        request: resources of one actor, e.g. ``{"CPU": 0.25}``; an empty request fits any node.
        limit: the most copies wanted.

    Returns:
        The number of copies placed (0 when no node has room or no node is given).
    """
    placed = 0
    key = next(iter(request), None)
    while placed < limit:
        fitting = [
            node for node in free if all(node.get(name, 0.0) + EPSILON >= need for name, need in request.items())
        ]
        if not fitting:
            break
        node = max(fitting, key=lambda n: n.get(key, 0.0)) if key else fitting[0]
        for name, need in request.items():
            node[name] = node.get(name, 0.0) - need
        placed += 1
    return placed


def sampler_room(free: list[dict[str, float]], config: SamplerConfig, limit: int) -> int:
    """How many new samplers fit into ``free``, each with the ``envs_per_sampler`` env actors it starts
    with (a sampler whose first env actors cannot be placed could not play); at most ``limit``.
    Subtracts what it places from ``free`` in place."""
    placed = 0
    while placed < limit:
        trial = [dict(node) for node in free]
        envs = config.envs_per_sampler
        if not fit_count(trial, sampler_request(config), 1) or fit_count(trial, env_request(config), envs) < envs:
            break
        free[:] = trial
        placed += 1
    return placed


@dataclass(frozen=True)
class ActorNeed:
    """``count`` actors of one kind, each reserving ``request`` on one node; ``what`` names them and the
    settings behind them (for messages)."""

    what: str
    request: dict[str, float]
    count: int


@dataclass(frozen=True)
class PoolNeed:
    """One env's sampler pool: its sampler actors and the env actors each of them owns."""

    env: str
    sampler: dict[str, float]
    env_actor: dict[str, float]
    min_count: int
    count: int
    min_envs: int
    envs: int


def node_capacities() -> list[dict[str, float]]:
    """The total resources of each live node (what fits when nothing else runs)."""
    return [dict(node["Resources"]) for node in ray.nodes() if node["Alive"]]


def plan_actors(nodes: list[dict[str, float]], fixed: list[ActorNeed], pools: list[PoolNeed]) -> list[list[int]]:
    """The samplers each pool starts with, as the env actor count of each (pure; see ``fit_count``).

    First the run's minimum, all pools together: every ``fixed`` actor, then each pool's ``min_count``
    samplers with ``min_envs`` env actors each. Then, pool by pool, into the room left: the minimum
    samplers' env actors up to ``envs``, then more samplers up to ``count``, each only with all of its
    ``envs`` env actors (a sampler is never started without room for its env actors).

    Args:
        nodes: resources per node, e.g. ``[{"CPU": 2.0}]``.
        fixed: learners, serve replicas: actors that must all fit.
        pools: the sampler pools, one per env.

    Returns:
        For each pool, one entry per sampler to start: its number of env actors.

    Raises:
        ClusterError: the minimum does not fit; the message lists every need, the totals and the nodes.
    """
    free = [dict(node) for node in nodes]
    for need in fixed:
        if fit_count(free, need.request, need.count) < need.count:
            raise ClusterError(_shortfall(nodes, fixed, pools, f"{need.what} x {_fmt(need.request)}"))
    for pool in pools:
        for _ in range(pool.min_count):
            if not fit_count(free, pool.sampler, 1) or fit_count(free, pool.env_actor, pool.min_envs) < pool.min_envs:
                raise ClusterError(_shortfall(nodes, fixed, pools, f"the samplers of env {pool.env}"))
    plans = []
    for pool in pools:
        plan = [
            pool.min_envs + fit_count(free, pool.env_actor, pool.envs - pool.min_envs) for _ in range(pool.min_count)
        ]
        while len(plan) < pool.count:
            trial = [dict(node) for node in free]
            if not fit_count(trial, pool.sampler, 1) or fit_count(trial, pool.env_actor, pool.envs) < pool.envs:
                break
            free[:] = trial
            plan.append(pool.envs)
        plans.append(plan)
    return plans


def _fmt(request: dict[str, float]) -> str:
    return "{" + ", ".join(f"{name}: {amount:g}" for name, amount in request.items()) + "}"


def _shortfall(nodes: list[dict[str, float]], fixed: list[ActorNeed], pools: list[PoolNeed], culprit: str) -> str:
    """The message of a minimum that does not fit: every need, the totals, what each node has."""
    needs = [f"{need.count} {need.what} x {_fmt(need.request)}" for need in fixed if need.count]
    total: dict[str, float] = {}
    for need in fixed:
        for name, amount in need.request.items():
            total[name] = total.get(name, 0.0) + need.count * amount
    for pool in pools:
        needs.append(
            f"{pool.min_count} sampler(s) of env {pool.env} (sampler.min_count) x {_fmt(pool.sampler)}, each with "
            f"{pool.min_envs} env actor(s) (sampler.min_envs_per_sampler) x {_fmt(pool.env_actor)}"
        )
        for request, count in ((pool.sampler, pool.min_count), (pool.env_actor, pool.min_count * pool.min_envs)):
            for name, amount in request.items():
                total[name] = total.get(name, 0.0) + count * amount
    names = list(total)
    have = "; ".join(f"node {i}: {_fmt({n: node.get(n, 0.0) for n in names})}" for i, node in enumerate(nodes))
    return (
        f"the cluster cannot hold the actors this run needs at the least: {'; '.join(needs)}. In all "
        f"{_fmt(total)}, and the cluster's {len(nodes)} node(s) have {have or 'nothing'} ({culprit} did not fit). "
        "Add nodes or raise ray.num_cpus (local Ray), or lower those counts and their num_cpus and num_gpus settings"
    )


def has_room(request: dict[str, float]) -> bool:
    """Whether some live node can place an actor that needs ``request`` now."""
    return fit_count(free_resources_per_node(), request, 1) == 1


def start_env_actor(env: EnvConfig, sampler: SamplerConfig) -> ray.actor.ActorHandle:
    """Start an env actor for ``env`` (holding ``sampler.envs_per_actor`` instances), spread over the cluster's
    nodes."""
    actor_cls = ray.remote(EnvHost).options(
        num_cpus=sampler.env_num_cpus, max_restarts=ENV_MAX_RESTARTS, scheduling_strategy="SPREAD"
    )
    return actor_cls.remote(env.name, env.options, sampler.envs_per_actor)


def on_this_node() -> dict[str, Any]:
    """Actor options that pin an actor to the driver's node.

    For the small stateful actors whose loss would end the run (the curriculum): they share the
    driver's fate anyway, so they should not add another node's. The affinity is hard: Ray's soft
    affinity was seen placing such a zero-CPU actor on another node although the driver's had room.
    """
    node_id = ray.get_runtime_context().get_node_id()
    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)}

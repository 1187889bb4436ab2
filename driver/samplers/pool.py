"""One env's elastic sampler pool, a piece of ``SamplerGroup``: its samplers (each owning its env actors) grow into
new room and shrink when actors or nodes die.

At each iteration start (``refresh``) the pool probes every sampler, drops the dead ones, then grows toward
``sampler.max_count`` samplers and every sampler toward ``sampler.max_envs_per_sampler`` env actors, as far as
the cluster has room right now (see ``actors.cluster``); fewer samplers than ``sampler.min_count`` (or a sampler
with fewer env actors than ``sampler.min_envs_per_sampler``) ends the run with ``PoolError``.
Dead env actors are handled inside each sampler (replaced while there is room, dropped otherwise).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from itertools import takewhile

import ray
import structlog

from agentgym_rl.actors.cluster import (
    Colocation,
    actor_gpus,
    env_request,
    fit_count,
    free_resources_per_node,
    sampler_request,
    sampler_room,
)
from agentgym_rl.actors.engines import EngineUnavailableError, engine_class
from agentgym_rl.actors.sampler import SamplerActor
from agentgym_rl.configs import Config
from agentgym_rl.configs.errors import AgentGymError

log = structlog.get_logger()

# Beyond its env actors' start-up, a live sampler answers at once (it is an async actor); this bounds a hung one.
PROBE_TIMEOUT_S = 60.0


class PoolError(AgentGymError, RuntimeError):
    """The pools fell below their configured minimum and the cluster has no room to refill them."""


def sampler_lost(exc: BaseException) -> bool:
    """Whether ``exc`` (raised by ``ray.get`` on a sampler call or on the objects it returned) means the
    sampler is gone: its process or node died, or the objects it owned died with it. An exception
    raised inside the sampler's own code (``RayTaskError``) is not a loss."""
    lost = (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError)
    return isinstance(exc, lost) and not isinstance(exc, ray.exceptions.RayTaskError)


def start_wait_s(timeout_s: float, starting: int, nodes: int) -> float:
    """How long a pool waits for ``starting`` samplers started at once: ``timeout_s`` (``sampler.start_timeout_s``)
    for each one that a node starts beside others, spread evenly over ``nodes``: engines that start together on a
    node share its disk and CPUs as they load and compile (a colocated run starts every sampler at once)."""
    return timeout_s * max(1, math.ceil(starting / max(1, nodes)))


def sampler_nodes(config: Config) -> int:
    """The live nodes that have every kind of resource a sampler reserves (a GPU sampler's, GPU nodes)."""
    kinds = [kind for kind, amount in sampler_request(config.sampler).items() if amount > 0]
    return sum(1 for node in ray.nodes() if node["Alive"] and all(node["Resources"].get(k, 0) > 0 for k in kinds))


def share_growth(counts: list[int], maximum: int, room: int) -> list[int]:
    """How many env actors to add to each sampler: ``room`` new actors, each to the sampler that has
    the fewest so far (ties: the earliest), none beyond ``maximum``.

    Example: ``share_growth([2, 4, 3], maximum=4, room=3) == [2, 0, 1]``.
    """
    added = [0] * len(counts)
    for _ in range(room):
        open_ = [i for i, n in enumerate(counts) if n + added[i] < maximum]
        if not open_:
            break
        added[min(open_, key=lambda i: counts[i] + added[i])] += 1
    return added


class SamplerPool:
    """One env's samplers, each owning its env actors.

    Args:
        config: the resolved run config.
        label: what the pool's ``PoolError`` messages start with (the env's name in a run that mixes envs).
    """

    def __init__(self, config: Config, label: str | None = None) -> None:
        self.config = config
        self.label = label
        self.samplers: list[ray.actor.ActorHandle] = []
        self.env_counts: dict[ray.actor.ActorHandle, int] = {}
        self.indices: dict[ray.actor.ActorHandle, int] = {}
        self.next_index = 0
        # The latest version in the object store (``[ref]``, published on the call): what samplers that join load.
        self.weights: Callable[[], list[ray.ObjectRef]] | None = None
        # Colocated mode: the learners' placement group, whose bundle i holds sampler i beside learner i.
        self.bundles: Colocation | None = None
        self.bundle_of: dict[ray.actor.ActorHandle, int] = {}
        self.counters: dict[int | None, dict[str, float]] = defaultdict(lambda: defaultdict(float))

    @property
    def max_count(self) -> int:
        cfg = self.config.sampler
        return cfg.max_count if cfg.max_count is not None else cfg.count

    @property
    def max_envs(self) -> int:
        cfg = self.config.sampler
        return cfg.max_envs_per_sampler if cfg.max_envs_per_sampler is not None else cfg.envs_per_sampler

    def env_actors(self) -> int:
        """Env actors of the live samplers (as of the last probe or growth)."""
        return sum(self.env_counts.get(s, 0) for s in self.samplers)

    # ----------------------------------------------------------------------------- starting and growing

    def start(self, env_actors: list[int]) -> None:
        """Start one sampler per entry of ``env_actors`` (``actors.cluster.plan_actors``' plan for this
        pool), each with that many env actors; those not up within ``sampler.start_timeout_s`` are given
        up. A plan below ``sampler.count`` is said in a warning: the pool grows when room appears.

        Raises:
            PoolError: the engine cannot run here (a package it needs is missing), or fewer than
                ``sampler.min_count`` started.
        """
        cfg = self.config.sampler
        try:  # checked here, where the message can reach the user, not in a sampler that would die of it
            engine_class(cfg.engine).check_available(f"sampler.engine={cfg.engine!r}")
        except EngineUnavailableError as exc:
            raise self._error(str(exc)) from None
        _, failures = self._spawn(env_actors)
        if len(self.samplers) < cfg.min_count and failures:
            raise self._error(
                f"{len(failures)} of {len(env_actors)} sampler(s) did not start, leaving {len(self.samplers)}, below "
                f"sampler.min_count={cfg.min_count}: " + "; ".join(sorted(set(failures)))
            )
        self._check_minimum()
        if len(env_actors) < cfg.count:
            log.warning(
                "the sampler pool is smaller than asked: no room for more samplers with their env actors",
                samplers=len(self.samplers),
                asked=cfg.count,
                sampler_needs=sampler_request(cfg),
                env_actors_per_sampler=cfg.envs_per_sampler,
                env_actor_needs=env_request(cfg),
            )
        log.info("sampler pool started", samplers=len(self.samplers), env_actors=self.env_actors())

    def _spawn(self, env_actors: list[int]) -> tuple[list[ray.actor.ActorHandle], list[str]]:
        """Start a sampler per entry of ``env_actors`` (with that many env actors), wait for them, load the
        current weights; returns those up, and why each of the others did not start."""
        cfg = self.config
        sampler_cls = ray.remote(SamplerActor)
        options = {
            "num_cpus": cfg.sampler.num_cpus,
            "num_gpus": actor_gpus(cfg.sampler.num_gpus) if self.bundles is None else self.bundles.gpus_each,
            "resources": cfg.sampler.resources or None,
            "max_concurrency": 1000,
        }
        fresh = []
        # Colocated: a sampler's bundle is fixed. Otherwise Ray places it wherever there is room (no bundle).
        taken = {self.bundle_of[s] for s in self.samplers} if self.bundles is not None else set()
        for count in env_actors:
            if self.bundles is not None:  # the lowest bundle without a live sampler
                index = min(set(range(self.bundles.count)) - taken)
                taken.add(index)
                options["scheduling_strategy"] = self.bundles.strategy(index)
            handle = sampler_cls.options(**options).remote(
                index=self.next_index,
                model=cfg.model,
                sampler=cfg.sampler,
                env=cfg.env,
                seed=cfg.run.seed,
                env_actors=count,
                lora_rank=cfg.learner.lora.r if cfg.learner.lora.enabled else None,
            )
            self.indices[handle] = self.next_index
            if self.bundles is not None:
                self.bundle_of[handle] = index
            self.next_index += 1
            fresh.append(handle)
        probes = {s.state.remote(): s for s in fresh}
        limit = start_wait_s(cfg.sampler.start_timeout_s, len(fresh), sampler_nodes(cfg))
        ready, _ = ray.wait(list(probes), num_returns=len(probes), timeout=limit)
        started, failures = [], []
        for ref, handle in probes.items():
            try:
                if ref not in ready:
                    raise TimeoutError(
                        f"not started within {limit:g} s (sampler.start_timeout_s={cfg.sampler.start_timeout_s:g} for "
                        f"each of the {len(fresh)} samplers that started at once, spread over the nodes that hold them)"
                    )
                self.env_counts[handle] = ray.get(ref)["env_actors"]
                if self.weights is not None:
                    ray.get(handle.load_weights.remote(self.weights()))
                started.append(handle)
            except (TimeoutError, ray.exceptions.RayError) as exc:
                failures.append(raised(exc))
                log.warning("sampler did not start", sampler=self.indices[handle], reason=failures[-1])
                ray.kill(handle, no_restart=True)
        self.samplers.extend(started)
        return started, failures

    def refresh(self, iteration: int) -> None:
        """The iteration-boundary check: drop dead samplers, grow both pools into the room the cluster
        has now, record the sizes as ``iteration``'s ``pool/*`` metrics.

        Raises:
            PoolError: below ``sampler.min_count`` samplers or ``sampler.min_envs_per_sampler`` env actors.
        """
        self._probe(iteration)
        counts = self.counters[iteration]
        # Read once: what the steps below start is subtracted here as they go (Ray's report would lag).
        free = free_resources_per_node()
        room = self._sampler_room(free, self.max_count - len(self.samplers))
        if room:
            started, _ = self._spawn([self.config.sampler.envs_per_sampler] * room)
            counts["pool/samplers_added"] += len(started)
        wanted = sum(max(self.max_envs - self.env_counts[s], 0) for s in self.samplers)
        room = fit_count(free, env_request(self.config.sampler), wanted) if wanted else 0
        if room:
            shares = share_growth([self.env_counts[s] for s in self.samplers], self.max_envs, room)
            grown = {s.add_envs.remote(n): s for s, n in zip(self.samplers, shares, strict=True) if n}
            for ref, handle in grown.items():
                try:
                    now = ray.get(ref)
                except ray.exceptions.RayError as exc:
                    if not sampler_lost(exc):
                        raise
                    self.lose(handle, iteration, exc)
                    continue
                counts["pool/env_actors_added"] += max(now - self.env_counts[handle], 0)
                self.env_counts[handle] = now
        counts["pool/samplers"] = float(len(self.samplers))
        counts["pool/env_actors"] = float(self.env_actors())
        if any(counts[key] for key in ("pool/samplers_added", "pool/samplers_lost", "pool/env_actors_added")):
            log.info(
                "pools resized",
                samplers=len(self.samplers),
                env_actors=self.env_actors(),
                samplers_added=int(counts["pool/samplers_added"]),
                samplers_lost=int(counts["pool/samplers_lost"]),
                env_actors_added=int(counts["pool/env_actors_added"]),
            )
        self._check_minimum()

    def _sampler_room(self, free: list[dict[str, float]], missing: int) -> int:
        """How many of ``missing`` samplers can start now: colocated, every one (a lost sampler's bundle still
        holds its share); otherwise as many as the nodes' ``free`` resources fit (subtracted from ``free``)."""
        if missing <= 0:
            return 0
        if self.bundles is not None:
            return missing
        return sampler_room(free, self.config.sampler, missing)

    def _probe(self, iteration: int | None) -> None:
        """Wait for every sampler's env actors to be up (so the free resources read next are what the
        running actors left); drop dead and unresponsive samplers, note env actor counts."""
        probes = {s.ready_envs.remote(): s for s in self.samplers}
        limit = self.config.sampler.start_timeout_s + PROBE_TIMEOUT_S
        ready, _ = ray.wait(list(probes), num_returns=len(probes), timeout=limit)
        for ref, handle in probes.items():
            if ref not in ready:
                self.lose(handle, iteration, TimeoutError(f"no answer within {limit} s"))
                continue
            try:
                self.env_counts[handle] = ray.get(ref)
            except ray.exceptions.RayError as exc:
                if not sampler_lost(exc):
                    raise
                self.lose(handle, iteration, exc)

    def _check_minimum(self) -> None:
        cfg = self.config.sampler
        if len(self.samplers) < cfg.min_count:
            raise self._error(
                f"{len(self.samplers)} sampler(s) alive, below sampler.min_count={cfg.min_count}, and no node has "
                f"room for another (each needs {sampler_request(cfg)}); add nodes or lower sampler.min_count"
            )
        short = {
            self.indices[s]: self.env_counts[s] for s in self.samplers if self.env_counts[s] < cfg.min_envs_per_sampler
        }
        if short:
            raise self._error(
                f"sampler(s) {sorted(short)} have {sorted(short.values())} env actors, below "
                f"sampler.min_envs_per_sampler={cfg.min_envs_per_sampler}, and no node has room for more (each "
                f"needs {env_request(cfg)}); add nodes or lower sampler.min_envs_per_sampler"
            )

    def _error(self, message: str) -> PoolError:
        return PoolError(f"{self.label}: {message}" if self.label else message)

    # ----------------------------------------------------------------------------- losses

    def lose(self, sampler: ray.actor.ActorHandle, iteration: int | None, reason: BaseException) -> None:
        """Drop ``sampler`` (idempotent) and kill it to be sure (a hung one would hold its resources)."""
        if sampler not in self.samplers:
            return
        self.samplers.remove(sampler)
        self.env_counts.pop(sampler, None)
        self.bundle_of.pop(sampler, None)  # its bundle is free for the replacement
        ray.kill(sampler, no_restart=True)
        self.counters[iteration]["pool/samplers_lost"] += 1
        log.warning(
            "sampler lost; the pool shrinks",
            sampler=self.indices[sampler],
            samplers=len(self.samplers),
            reason=first_line(reason),
        )

    def keep_one(self, iteration: int | None) -> None:
        """After a loss: start a sampler when none is left and the cluster has room for one.

        Raises:
            PoolError: no sampler is left and no node has room to start one.
        """
        if not self.samplers and self._sampler_room(free_resources_per_node(), 1):
            started, _ = self._spawn([self.config.sampler.envs_per_sampler])
            self.counters[iteration]["pool/samplers_added"] += len(started)
        if not self.samplers:
            raise self._error(
                f"every sampler died and no node has room to start a new one (each needs "
                f"{sampler_request(self.config.sampler)}); add nodes"
            )

    def metrics(self, iteration: int) -> dict[str, float]:
        """``iteration``'s ``pool/*`` metrics (sizes at its start, additions, losses, moved task groups)."""
        counts = self.counters.pop(iteration, {})
        carried = self.counters.pop(None, {})  # losses noticed outside any iteration (a resume's weight sync)
        merged = defaultdict(float, counts)
        for key, value in carried.items():
            merged[key] += value
        keys = (
            "pool/samplers",
            "pool/env_actors",
            "pool/samplers_added",
            "pool/samplers_lost",
            "pool/env_actors_added",
            "pool/redispatched",
        )
        return {key: float(merged[key]) for key in keys}


def first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0]


def raised(exc: BaseException) -> str:
    """What an actor's own code raised, in one line. Ray's message for it (a constructor's or a method's
    exception) starts with a generic line and ends with the remote traceback, whose last lines, the only ones
    not indented, are the exception itself."""
    if isinstance(exc, ray.exceptions.RayTaskError) or getattr(exc, "actor_init_failed", False):
        tail = list(takewhile(lambda line: line[:1] not in ("", " "), reversed(str(exc).splitlines())))
        if tail:
            return " ".join(reversed(tail))
    return first_line(exc)

"""``SamplerGroup``: the one owner of a run's samplers, as RLlib's ``EnvRunnerGroup`` owns its env runners.

It starts them (one elastic ``SamplerPool`` per env), probes and grows them at each iteration boundary, submits
every episode a run plays (training, held-out tasks, ``agentgym-rl eval``) and awaits it, replays the episodes of
a lost sampler on a survivor, calls a method on every sampler, and delivers each weights version by the transport
the two ends call for (``driver.samplers.transports``). Callers ask the group; none of them holds a sampler.

Every ``collect`` call is awaited with ``completed``: when its sampler dies (or dies after returning, taking the
trajectories it owned along), the group drops it and plays the same requests (same seeds) on the least busy
survivor of the same pool, starting a replacement only when none is left. An error raised inside a sampler (its
env or engine failed) ends the wait as ``SamplerFailed``, one line naming what was raised.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TypeVar

import ray
import structlog

from agentgym_rl.actors.cluster import Colocation
from agentgym_rl.actors.sampler import EpisodeRequest, start_collect
from agentgym_rl.actors.trajectory import Trajectory
from agentgym_rl.actors.transport import choose_transport
from agentgym_rl.configs import Config
from agentgym_rl.configs.errors import AgentGymError
from agentgym_rl.driver.metrics import pool_metrics
from agentgym_rl.driver.samplers.pool import SamplerPool, first_line, sampler_lost
from agentgym_rl.driver.samplers.transports import AwaitLoads, WeightSource, WeightTransport, transport_class

log = structlog.get_logger()

Key = TypeVar("Key")


class SamplerFailed(AgentGymError, RuntimeError):
    """Code inside a sampler raised (its env or engine failed): the run cannot go on. The message is one line,
    the exception that was raised, not Ray's traceback of it."""


def cause_line(exc: BaseException) -> str:
    """``exc``'s innermost cause as ``Type: first line of its message``. Ray wraps an actor method's exception in
    a ``RayTaskError`` whose cause is the exception itself, or another ``RayTaskError`` when the method was
    awaiting a call of another actor (a sampler awaiting its env actor)."""
    while isinstance(exc, ray.exceptions.RayTaskError) and exc.cause is not None and exc.cause is not exc:
        exc = exc.cause
    return first_line(exc)


@dataclass
class Call:
    """One ``collect`` call in flight: who plays it and what, so it can be played again elsewhere."""

    pool: SamplerPool
    sampler: ray.actor.ActorHandle
    requests: list[EpisodeRequest]
    returns: list[ray.ObjectRef]  # one per request


class SamplerGroup:
    """The samplers of a run (or of an evaluation), one pool per env.

    Args:
        config: the resolved run config (``trainer.weight_sync`` and ``learner.lora`` decide how weights go).
    """

    def __init__(self, config: Config) -> None:
        self.config = config
        self.pools: list[SamplerPool] = []  # one per env, in env order, once started
        self.calls: dict[int, Call] = {}  # collect calls in flight by id (an id outlives a replay)
        self.call_ids = itertools.count()
        self.transport: WeightTransport | None = None  # how versions reach its samplers, while they stay the same
        self.engine_bytes: dict[int | None, float] = {}  # by iteration: what its weight sync put into one engine

    @property
    def samplers(self) -> list[ray.actor.ActorHandle]:
        """Every live sampler, env by env (the pools shrink and grow during a run)."""
        return [sampler for pool in self.pools for sampler in pool.samplers]

    def env_actors(self) -> int:
        """The env actors of every live sampler."""
        return sum(pool.env_actors() for pool in self.pools)

    # ----------------------------------------------------------------------------- starting and growing

    def start(self, configs: list[Config], plans: list[list[int]], *, bundles: Colocation | None = None) -> None:
        """Start one pool per env: ``configs[i]`` is env i's config (``driver.mix.env_run_config``), ``plans[i]``
        its env actors per sampler (``actors.cluster.plan_actors``).

        Args:
            configs: each env's config, in env order.
            plans: each env's plan, in env order.
            bundles: colocated mode: the learners' bundles, sampler i going into learner i's (else None).

        Raises:
            PoolError: a pool could not start (its messages start with the env's name in a run of several envs).
        """
        labelled = len(configs) > 1
        for config, plan in zip(configs, plans, strict=True):
            pool = SamplerPool(config, label=config.env.name if labelled else None)
            pool.bundles = bundles
            self.pools.append(pool)
            pool.start(plan)

    def refresh(self, iteration: int) -> None:
        """The iteration boundary: drop dead samplers and grow every pool into the room the cluster has now.

        Raises:
            PoolError: a pool is below its ``sampler.min_count`` or ``sampler.min_envs_per_sampler``.
        """
        for pool in self.pools:
            pool.refresh(iteration)

    def metrics(self, iteration: int) -> dict[str, float]:
        """``iteration``'s ``pool/*`` metrics, summed over the pools, and ``sync/engine_bytes``: what its weight
        sync put into one engine (0 without a sync); none without samplers."""
        if not self.pools:
            return {}
        synced = {"sync/engine_bytes": self.engine_bytes.pop(iteration, 0.0)}
        return {**pool_metrics([pool.metrics(iteration) for pool in self.pools]), **synced}

    # ----------------------------------------------------------------------------- episodes

    def submit(self, requests: list[EpisodeRequest], *, env: int = 0) -> int:
        """Start ``requests`` (one ``collect`` call) on the least busy sampler of env ``env``'s pool; returns the
        call's id for ``completed``."""
        call = next(self.call_ids)
        self.calls[call] = self._start(self.pools[env], requests)
        return call

    def _start(self, pool: SamplerPool, requests: list[EpisodeRequest]) -> Call:
        busy = Counter(call.sampler for call in self.calls.values())
        sampler = min(pool.samplers, key=lambda s: busy[s])  # ties: the earliest, so a batch goes round the pool
        return Call(pool, sampler, requests, start_collect(sampler, requests))

    def completed(
        self, calls: Mapping[int, Key], iteration: int | None
    ) -> Iterator[tuple[Key, list[ray.ObjectRef], list[Trajectory]]]:
        """Wait for the calls ``calls`` names (id -> the caller's key); yield each call's key, trajectory refs and
        trajectories (in the order of its requests) as it completes, in completion order.

        The refs are the call's return values, owned by this process: the learner reads these very objects,
        whatever becomes of the sampler, and no trajectory is stored twice. A call whose sampler died (before
        or after it returned) is played again on a survivor of the same pool (counted in ``iteration``'s
        ``pool/*`` metrics), so every call yields once.

        Raises:
            PoolError: a pool lost its last sampler and has no room to start another.
            SamplerFailed: code inside a sampler raised (its env or its engine failed).
        """
        keys = dict(calls)
        waiting = {self.calls[call].returns[0]: call for call in keys}
        try:
            while waiting:
                [ready], _ = ray.wait(list(waiting), num_returns=1)
                call = waiting.pop(ready)
                started = self.calls[call]
                try:
                    trajectories = ray.get(started.returns)
                except ray.exceptions.RayError as exc:
                    if not sampler_lost(exc):
                        raise self._failed(started, exc) from exc
                    self.calls[call] = self._replay(started, iteration, exc)
                    waiting[self.calls[call].returns[0]] = call
                    continue
                del self.calls[call]
                yield keys.pop(call), started.returns, trajectories
        finally:  # a wait that ended early (an error, a caller that stopped reading) leaves its calls to nobody
            for call in keys:
                self.calls.pop(call, None)

    @staticmethod
    def _failed(call: Call, exc: BaseException) -> SamplerFailed:
        env = f" (env {call.pool.label})" if call.pool.label else ""
        return SamplerFailed(f"sampler {call.pool.indices[call.sampler]}{env} failed: {cause_line(exc)}")

    def _replay(self, call: Call, iteration: int | None, reason: BaseException) -> Call:
        """Drop the lost sampler of ``call`` and start its requests again on a survivor of the same pool."""
        pool = call.pool
        pool.lose(call.sampler, iteration, reason)
        pool.keep_one(iteration)
        pool.counters[iteration]["pool/redispatched"] += 1
        again = self._start(pool, call.requests)
        log.warning("task group moved to another sampler", group=call.requests[0].group, to=pool.indices[again.sampler])
        return again

    # ----------------------------------------------------------------------------- every sampler at once

    def call_all(self, method: str) -> float:
        """Call ``method`` (no arguments) on every live sampler and wait (a lost sampler is dropped); returns the
        seconds it took."""
        started = time.perf_counter()
        calls = {getattr(sampler, method).remote(): (pool, sampler) for pool in self.pools for sampler in pool.samplers}
        for ref, (pool, sampler) in calls.items():
            try:
                ray.get(ref)
            except ray.exceptions.RayError as exc:
                if not sampler_lost(exc):
                    raise
                pool.lose(sampler, None, exc)
        return time.perf_counter() - started

    # ----------------------------------------------------------------------------- weights

    def sync_weights(self, source: WeightSource, iteration: int | None) -> tuple[int | None, int]:
        """Deliver ``source``'s current version to every live sampler, and let samplers that join later read it
        from the object store. The transport is the object store, or with ``trainer.weight_sync.method``
        ``broadcast`` (``auto`` on a GPU learner) the one the ends' devices call for: CUDA IPC where every engine
        is on the learner's GPU, else a broadcast (NCCL or gloo); chosen again, and a broadcast's group formed
        again, when the samplers changed. A failed delivery (a sampler lost on the way, a timeout, a group that
        did not form) is said in a warning and the version goes through the object store instead.

        Returns:
            the version the samplers hold now (None with no sampler left) and the bytes sent (the object store
            copy's size where that was the way).

        Raises:
            ray.exceptions.RayActorError | ray.exceptions.ObjectLostError: a learner died (``source``'s calls, or the
                object store's copy it owned); the caller decides what follows.
            SamplerFailed: a live sampler's load from the object store raised.
        """
        for pool in self.pools:
            pool.weights = source.published
        samplers = self.samplers
        if not samplers:
            return None, 0
        try:
            transport = self._transport(source, samplers)
            delivered = transport.deliver(self._waiter(iteration, strict=transport.name == "object_store"))
            failures = delivered.failures
        except ray.exceptions.RayTaskError as exc:  # the group did not form, or the sender's part failed
            if isinstance(exc, ray.exceptions.ObjectLostError):  # the learner that put the version died
                raise
            transport, failures = None, [first_line(exc)]
        if failures and (transport is None or transport.name != "object_store"):
            self.transport = None  # chosen (and a group formed) again at the next sync
            log.warning(
                "weight sync failed; this version goes through the object store",
                transport=transport.name if transport is not None else None,
                reasons=failures,
            )
            fallback = transport_class("object_store")(
                source, self.samplers, self.config.trainer.weight_sync, adapter=self.config.learner.lora.enabled
            )
            delivered = fallback.deliver(self._waiter(iteration, strict=True))
        if not delivered.versions:
            return None, 0
        self.engine_bytes[iteration] = self._engine_bytes()
        return delivered.versions[0], delivered.sent_bytes or source.published_bytes()

    def _engine_bytes(self) -> float:
        """The most bytes the version just delivered put into one engine: ``engine_version_bytes`` of the samplers'
        states, which the vLLM engine counts (a LoRA run's adapter, else the whole model); 0 where none does."""
        states = ray.get([sampler.state.remote() for sampler in self.samplers])
        counted = [state["engine_version_bytes"] for state in states if "engine_version_bytes" in state]
        return float(max(counted, default=0))

    def forget_transport(self) -> None:
        """The learners were replaced: the next sync chooses the transport again (a broadcast forms a new group)."""
        self.transport = None

    def _transport(self, source: WeightSource, samplers: list[ray.actor.ActorHandle]) -> WeightTransport:
        """The transport for ``samplers``: the one in use while they stay the same, else a new one."""
        if self.transport is not None and self.transport.samplers == samplers:
            return self.transport
        cfg = self.config.trainer.weight_sync
        adapter = self.config.learner.lora.enabled
        self.transport = None
        name, backend = "object_store", None
        if cfg.method == "broadcast" or (cfg.method == "auto" and source.device == "cuda"):
            identities = ray.get([sampler.weight_group_identities.remote(adapter) for sampler in samplers])
            chosen = choose_transport(source.device_identity(), [own for each in identities for own in each])
            name, backend = ("cuda_ipc", None) if chosen == "cuda_ipc" else ("broadcast", chosen)
            log.info("weights go by", transport=name, backend=backend, receivers=len(samplers))
        self.transport = transport_class(name)(source, samplers, cfg, adapter=adapter, backend=backend)
        return self.transport

    def _waiter(self, iteration: int | None, *, strict: bool) -> AwaitLoads:
        """How a transport waits for the samplers' loads of one version, each up to a timeout: a lost sampler
        leaves its pool; any other failure is returned (``strict``: raised, the object store being the last way).

        Raises:
            ray.exceptions.ObjectLostError: the object store's copy died with its owner, the learner that put it.
            SamplerFailed: ``strict``, and a live sampler's load raised.
        """

        def await_loads(
            loads: dict[ray.ObjectRef, ray.actor.ActorHandle], timeout_s: float | None
        ) -> tuple[list[int], list[str]]:
            pool_of = {sampler: pool for pool in self.pools for sampler in pool.samplers}
            versions, failures = [], []
            for ref, sampler in loads.items():
                try:
                    versions.append(ray.get(ref, timeout=timeout_s))
                except ray.exceptions.RayError as exc:
                    if isinstance(exc, ray.exceptions.RayTaskError) and isinstance(exc, ray.exceptions.ObjectLostError):
                        raise  # the payload died with the learner that published it
                    lost = sampler_lost(exc)
                    if strict and not lost:
                        raise SamplerFailed(f"a sampler failed to load weights: {cause_line(exc)}") from exc
                    failures.append(first_line(exc))
                    if lost and sampler in pool_of:
                        pool_of[sampler].lose(sampler, iteration, exc)
            return versions, failures

        return await_loads

    def stop(self) -> None:
        """Kill the samplers; their env actors go with them."""
        for sampler in self.samplers:
            ray.kill(sampler)

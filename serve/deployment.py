"""The model deployment: one serving engine per replica (continuous batching, token streaming) and
weight hot-swap. Each replica also answers HTTP itself (``serve.app.PolicyServer``), so a request
crosses one process boundary, Serve's proxy to the replica.

Loading: on the application's first start a replica returns from its constructor at once and loads
the model in a thread; Serve then routes requests to it, and the routes answer 503 until the model
is loaded. Once a replica of the application has served, every later replica (autoscaling, restarts)
loads in its constructor instead, so Serve routes nothing to it before it can serve.

Weights reach every replica through a small named ``WeightsStore`` actor per application: a call
of ``update_weights`` (which Serve routes to one replica) loads the weights there and records the
``[ref]`` in the store; every other replica long-polls the store and loads the same version, and a
replica started later by autoscaling begins from the newest version instead of the source weights.
A swap waits for the requests in flight to finish on the old weights (the engine stops admitting
meanwhile), so a completion never mixes two versions, and every response names its version.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal

import ray
import structlog
import torch
from ray import serve

from agentgym_rl.actors.adapters import policy_source
from agentgym_rl.actors.engines import ChoiceDelta, CompletionRequest, ServingEngine, make_serving_engine
from agentgym_rl.actors.model_store import load_tokenizer
from agentgym_rl.actors.threads import capped
from agentgym_rl.actors.tool_formats import ToolTemplate
from agentgym_rl.actors.weights import WeightsPayload
from agentgym_rl.configs.schema import ServeConfig, VLLMConfig
from agentgym_rl.envs.actor import hide_unreserved_gpus
from agentgym_rl.serve.episodes import EpisodeBook

log = structlog.get_logger()

STORE_NAMESPACE = "agentgym-rl-serve"
# HTTP requests and control calls one replica takes at once. Generation beyond serve.max_batch_size +
# serve.max_queued_requests is refused far below this by the engine (429), so Serve never queues it.
MAX_ONGOING_REQUESTS = 1000


def store_name(app_name: str) -> str:
    return f"weights-{app_name}"


def episodes_name(app_name: str) -> str:
    return f"episodes-{app_name}"


def shared_actor(cls: type, name: str, *args: Any, **kwargs: Any) -> ray.actor.ActorHandle:
    """The application's one ``cls`` actor called ``name``, started by the first replica that asks (every
    replica of the application shares it)."""
    options = {"name": name, "namespace": STORE_NAMESPACE, "get_if_exists": True, "lifetime": "detached"}
    return ray.remote(cls).options(num_cpus=0, **options).remote(*args, **kwargs)


def episode_store(
    app_name: str, source: str, limits: ServeConfig, *, tool_format: str, tool_template: ToolTemplate
) -> ray.actor.ActorHandle:
    """The application's ``EpisodeBook`` actor: an episode's calls may reach any replica. It renders and reads tool
    calls as the replicas do (``model.tool_format``, ``model.tool_template``)."""
    return shared_actor(
        EpisodeBook,
        episodes_name(app_name),
        source,
        limits.episodes,
        limits.max_prompt_tokens,
        tool_format=tool_format,
        tool_template=tool_template,
    )


class WeightsStore:
    """Holds the newest ``[ref]`` of one application's weights (keeping the object alive) and its iteration,
    and whether a replica of the application has served yet."""

    def __init__(self) -> None:
        self.version = 0
        self.latest: tuple[list[ray.ObjectRef], int | None] | None = None
        self.changed = asyncio.Condition()
        self.served = False
        self.caches: dict[str, dict[str, int]] = {}  # each replica's last prefix-cache counters

    async def report(self, replica: str, counters: dict[str, int]) -> None:
        """Keep ``replica``'s prefix-cache counters (sent after each of its requests)."""
        self.caches[replica] = counters

    async def cache_reports(self) -> dict[str, dict[str, int]]:
        return self.caches

    async def mark_served(self) -> None:
        self.served = True

    async def has_served(self) -> bool:
        return self.served

    async def publish(self, payload_ref: list[ray.ObjectRef], version: int, iteration: int | None) -> None:
        async with self.changed:
            if version > self.version:
                self.version = version
                self.latest = (payload_ref, iteration)
                self.changed.notify_all()

    async def newer_than(self, version: int, timeout_s: float) -> tuple[list[ray.ObjectRef], int | None] | None:
        """The newest ``([ref], iteration)`` once its version exceeds ``version``; None after ``timeout_s``."""
        async with self.changed:
            if self.version <= version:
                try:
                    await asyncio.wait_for(self.changed.wait_for(lambda: self.version > version), timeout_s)
                except TimeoutError:
                    return None
            return self.latest


# The engine counters /v1/policy shows per replica: prompt ids run through the model, and those reused from the
# prefix cache (the transformers engine's; vLLM's own prefix cache reports none).
CACHE_COUNTERS = ("prefill_tokens", "reused_tokens")


@dataclass(frozen=True)
class ChoiceResult:
    """One finished choice: the sampled ids, their log-probabilities and top alternatives (when asked)."""

    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[tuple[tuple[int, float], ...]]
    finish_reason: Literal["stop", "length"]


@dataclass(frozen=True)
class GenerateResult:
    choices: list[ChoiceResult]
    weights_version: int


@dataclass(frozen=True)
class StreamStart:
    """First item of ``generate_stream``: the request was admitted and this weights version serves it."""

    weights_version: int


def build_engine(
    engine: str,
    *,
    source: str,
    dtype: str,
    seed: int,
    max_rows: int,
    max_kv_tokens: int,
    max_requests: int,
    vllm: VLLMConfig | None = None,
    max_cached_tokens: int = 0,
    lora_rank: int | None = None,
) -> ServingEngine:
    """The serving engine of a replica, with the source's stop and pad ids."""
    name, adapter = policy_source(source)
    tokenizer = load_tokenizer(name)
    return make_serving_engine(
        engine,
        model_name=name,
        adapter=adapter,
        dtype=dtype,
        seed=seed,
        stop_token_ids=[tokenizer.eos_token_id],
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
        max_rows=max_rows,
        max_kv_tokens=max_kv_tokens,
        max_requests=max_requests,
        vllm=vllm,
        max_cached_tokens=max_cached_tokens,
        lora_rank=lora_rank,
    )


def default_torch_threads(cores: int) -> int:
    """A replica's torch threads on a node of ``cores`` cores when ``serve.torch_threads`` is unset.

    One core is left to Serve's HTTP proxy and the replica's own request handling: a torch thread
    sharing its core with them stalls every parallel region of the decode step. At most 4, so a
    replica does not starve the samplers and the learner that share a training node with it.
    """
    return max(1, min(4, cores - 1))


class PolicyModel:
    """Serve deployment body (``serve.app.PolicyServer`` adds the HTTP routes).

    Args:
        source: checkpoint ``policy`` directory or model name the weights start from.
        engine: a registered engine name or its ``package.module:Class`` (see ``actors.engines.make_serving_engine``).
        dtype: parameter dtype (``auto``: bfloat16 where the hardware is fast at it).
        seed: seeds the sampling stream of requests without a seed.
        max_batch_size: most completions decoding at once.
        kv_cache_tokens: bound on the running batch's key/value positions (transformers engine).
        max_queued_requests: requests waiting for a row beyond the decoding ones; more are refused.
        torch_threads: torch threads of this replica (None: :func:`default_torch_threads`, capped by
            ``AGENTGYM_RL_TORCH_THREADS`` where set).
        app_name: Serve application name (names the weights store).
        vllm: the vLLM engine's settings (``serve.vllm``).
        prefix_cache_tokens: key/value positions kept between an episode's calls (transformers engine).
        lora_rank: a LoRA run's adapter rank: its versions reach the engine as adapters; None: full weights.
    """

    def __init__(
        self,
        *,
        source: str,
        engine: str,
        dtype: str,
        seed: int,
        max_batch_size: int,
        kv_cache_tokens: int,
        max_queued_requests: int,
        torch_threads: int | None,
        app_name: str,
        vllm: VLLMConfig | None = None,
        prefix_cache_tokens: int = 0,
        lora_rank: int | None = None,
    ) -> None:
        hide_unreserved_gpus()
        torch.set_num_threads(torch_threads or capped(default_torch_threads(os.cpu_count() or 1)))
        self.source = source
        self.engine_name = engine
        self.iteration: int | None = None
        self.updates = 0
        self.requests = 0  # generations this replica served
        self.store = shared_actor(WeightsStore, store_name(app_name))
        self.load_lock = asyncio.Lock()
        self.catch_up: asyncio.Task | None = None
        self.follow_task: asyncio.Task | None = None
        build = functools.partial(
            build_engine,
            engine,
            source=source,
            dtype=dtype,
            seed=seed,
            max_rows=max_batch_size,
            max_kv_tokens=kv_cache_tokens,
            max_requests=max_batch_size + max_queued_requests,
            vllm=vllm,
            max_cached_tokens=prefix_cache_tokens,
            lora_rank=lora_rank,
        )
        self.engine: ServingEngine | None = None
        loader = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="model-load")
        self.loading = loader.submit(build)
        loader.shutdown(wait=False)
        # The first replicas return at once: Serve routes requests to them, which get 503 until loaded. Once
        # a replica has served, a new one finishes loading here, so Serve routes nothing to it before then.
        if ray.get(self.store.has_served.remote()):
            self.loading.result()

    async def model_loaded(self) -> bool:
        """Whether the engine is built (raises the loading error if building it failed)."""
        if not self.loading.done():
            return False
        self.loading.result()
        return True

    async def _ensure_following(self) -> None:
        # Tasks must live on the replica's event loop, which __init__ does not run on. A replica that
        # starts mid-training (autoscaling, restart) loads the newest weights before its first request.
        if self.engine is None:
            self.engine = await asyncio.shield(asyncio.wrap_future(self.loading))
        if self.catch_up is None:
            loop = asyncio.get_running_loop()
            self.catch_up = loop.create_task(self._catch_up())
            self.follow_task = loop.create_task(self._follow_store())
        # Shielded: a client that disconnects cancels its own call, never the shared catch-up.
        await asyncio.shield(self.catch_up)

    async def _catch_up(self) -> None:
        await self._follow_once(0.0)
        await self.store.mark_served.remote()

    async def _follow_once(self, timeout_s: float) -> None:
        try:
            latest = await self.store.newer_than.remote(self.engine.weights_version, timeout_s)
            if latest is not None:
                payload_ref, iteration = latest
                await self._load(payload_ref, iteration)
        except ray.exceptions.RayError as exc:
            # Serving goes on with the weights already loaded; the next poll or update tries again.
            log.warning("weights store unavailable", error=str(exc))
            await asyncio.sleep(1.0)

    async def _follow_store(self) -> None:
        while True:
            await self._follow_once(30.0)

    async def _load(self, payload_ref: list[ray.ObjectRef], iteration: int | None) -> int:
        payload: WeightsPayload = await payload_ref[0]
        async with self.load_lock:
            if payload.version > self.engine.weights_version:
                # The engine lets the requests in flight finish on the old weights first.
                await self.engine.load_weights(payload)
                self.iteration = iteration
                self.updates += 1
                log.info("weights updated", version=payload.version, iteration=iteration)
        return self.engine.weights_version

    async def update_weights(self, payload_ref: list[ray.ObjectRef], iteration: int | None) -> int:
        """Load the ``WeightsPayload`` behind ``payload_ref[0]`` without a restart; returns the loaded version.

        Requests in flight finish on the old weights; requests admitted after the swap use the new
        ones. The ref is also published to the other replicas of this application.
        """
        await self._ensure_following()
        # Shielded: a cancelled caller must not leave the weights store behind the replica.
        version = await asyncio.shield(self._load(payload_ref, iteration))
        await self.store.publish.remote(payload_ref, version, iteration)
        return version

    async def ready(self) -> int:
        """The weights version, once this replica has caught up with the weights store."""
        await self._ensure_following()
        return self.engine.weights_version

    async def generate(self, request: CompletionRequest) -> GenerateResult:
        """Sample every choice of ``request`` to its end (it decodes alongside every other request)."""
        await self._ensure_following()
        tokens: dict[int, list[int]] = {c: [] for c in range(request.n)}
        logprobs: dict[int, list[float]] = {c: [] for c in range(request.n)}
        tops: dict[int, list[tuple[tuple[int, float], ...]]] = {c: [] for c in range(request.n)}
        reasons: dict[int, Literal["stop", "length"]] = {}
        try:
            async with self.engine.open(request) as stream:
                async for deltas in stream:
                    for delta in deltas:
                        tokens[delta.choice].extend(delta.token_ids)
                        logprobs[delta.choice].extend(delta.logprobs)
                        tops[delta.choice].extend(delta.top_logprobs)
                        if delta.finish_reason is not None:
                            reasons[delta.choice] = delta.finish_reason
        finally:
            self.report_cache()
        return GenerateResult(
            choices=[ChoiceResult(tokens[c], logprobs[c], tops[c], reasons[c]) for c in range(request.n)],
            weights_version=stream.weights_version,
        )

    async def generate_stream(self, request: CompletionRequest) -> AsyncIterator[StreamStart | list[ChoiceDelta]]:
        """A :class:`StreamStart`, then the request's deltas as they are sampled. The caller cancelling
        (its client went away) frees the request's rows at the next step."""
        await self._ensure_following()
        try:
            async with self.engine.open(request) as stream:
                yield StreamStart(stream.weights_version)
                async for deltas in stream:
                    yield deltas
        finally:
            self.report_cache()

    def report_cache(self) -> None:
        """Send this replica's prefix-cache counters to the weights store, which ``/v1/policy`` reads every
        replica's from (not awaited: a request never waits for it)."""
        stats = self.engine.stats
        counters = {key: value for key, value in stats.items() if key in CACHE_COUNTERS}
        self.requests += 1
        self.store.report.remote(
            serve.get_replica_context().replica_id.unique_id, {**counters, "requests": self.requests}
        )

    async def policy(self) -> dict:
        """Replica id, engine, weights version, training iteration, source, torch threads and engine counters of
        this replica, and every replica's last prefix-cache counters."""
        await self._ensure_following()
        return {
            "replica": serve.get_replica_context().replica_id.unique_id,
            "source": self.source,
            "engine": self.engine_name,
            "weights_version": self.engine.weights_version,
            "iteration": self.iteration,
            "updates": self.updates,
            "torch_threads": torch.get_num_threads(),
            "stats": self.engine.stats,
            "replicas": await self.store.cache_reports.remote(),
        }

"""The model deployment: one engine per replica, dynamic batching, and weight hot-swap.

Weights reach every replica through a small named ``WeightsStore`` actor per application: a call
of ``update_weights`` (which Serve routes to one replica) loads the weights there and records the
``[ref]`` in the store; every other replica long-polls the store and loads the same version, and a
replica started later by autoscaling begins from the newest version instead of the source weights.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass

import ray
import structlog
import torch
from ray import serve

from actors.engines import Generation, make_engine
from actors.models import load_tokenizer
from actors.weights import WeightsPayload
from configs.schema import SamplingConfig

log = structlog.get_logger()

STORE_NAMESPACE = "agentgym-rl-serve"


def store_name(app_name: str) -> str:
    return f"weights-{app_name}"


class WeightsStore:
    """Holds the newest ``[ref]`` of one application's weights (keeping the object alive) and its iteration."""

    def __init__(self) -> None:
        self.version = 0
        self.latest: tuple[list[ray.ObjectRef], int | None] | None = None
        self.changed = asyncio.Condition()

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


@dataclass(frozen=True)
class GenerateRequest:
    prompt_ids: list[int]
    sampling: SamplingConfig


@dataclass(frozen=True)
class GenerateResult:
    generation: Generation
    weights_version: int


class PolicyModel:
    """Serve deployment body (wrapped with ``serve.deployment`` in ``serve.app``).

    Args:
        source: checkpoint ``policy`` directory or model name the weights start from.
        dtype: parameter dtype.
        seed: seeds the sampling generator.
        max_batch_size: most requests per generation batch.
        batch_wait_timeout_s: how long a batch waits to fill.
        app_name: Serve application name (names the weights store).
    """

    def __init__(
        self, *, source: str, dtype: str, seed: int, max_batch_size: int, batch_wait_timeout_s: float, app_name: str
    ) -> None:
        # A replica shares the node with samplers and the learner; a few threads keep it from starving them.
        torch.set_num_threads(min(4, os.cpu_count() or 1))
        self.source = source
        tokenizer = load_tokenizer(source)
        self.engine = make_engine(
            "transformers",
            model_name=source,
            dtype=dtype,
            seed=seed,
            stop_token_ids=[tokenizer.eos_token_id],
            pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
        )
        self.iteration: int | None = None
        self.updates = 0
        self.batches = 0
        self.batched_requests = 0
        self.generate_s = 0.0
        # Held by each generate batch and by the swap: a batch always runs on one version of the weights.
        self.engine_lock = asyncio.Lock()
        self._generate_batch.set_max_batch_size(max_batch_size)
        self._generate_batch.set_batch_wait_timeout_s(batch_wait_timeout_s)
        self.store = (
            ray.remote(WeightsStore)
            .options(
                name=store_name(app_name),
                namespace=STORE_NAMESPACE,
                get_if_exists=True,
                lifetime="detached",
                num_cpus=0,
            )
            .remote()
        )
        self.catch_up: asyncio.Task | None = None
        self.follow_task: asyncio.Task | None = None

    async def _ensure_following(self) -> None:
        # Tasks must live on the replica's event loop, which __init__ does not run on. A replica that
        # starts mid-training (autoscaling, restart) loads the newest weights before its first batch.
        if self.catch_up is None:
            loop = asyncio.get_running_loop()
            self.catch_up = loop.create_task(self._follow_once(0.0))
            self.follow_task = loop.create_task(self._follow_store())
        # Shielded: a client that disconnects cancels its own call, never the shared catch-up.
        await asyncio.shield(self.catch_up)

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
        async with self.engine_lock:
            if payload.version > self.engine.weights_version:
                await asyncio.to_thread(self.engine.load_weights, payload)
                self.iteration = iteration
                self.updates += 1
                log.info("weights updated", version=payload.version, iteration=iteration)
        return self.engine.weights_version

    async def update_weights(self, payload_ref: list[ray.ObjectRef], iteration: int | None) -> int:
        """Load the ``WeightsPayload`` behind ``payload_ref[0]`` without a restart; returns the loaded version.

        In-flight batches finish on the old weights; batches after the swap use the new ones. The ref
        is also published to the other replicas of this application.
        """
        await self._ensure_following()
        # Shielded: a cancelled caller must not release the lock while the load thread still writes weights.
        version = await asyncio.shield(self._load(payload_ref, iteration))
        await self.store.publish.remote(payload_ref, version, iteration)
        return version

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Sample one completion; concurrent calls are grouped into one engine batch."""
        await self._ensure_following()
        return await self._generate_batch(request)

    @serve.batch(max_batch_size=16, batch_wait_timeout_s=0.01)
    async def _generate_batch(self, requests: list[GenerateRequest]) -> list[GenerateResult]:
        results: list[GenerateResult | None] = [None] * len(requests)
        self.batches += 1
        self.batched_requests += len(requests)
        # The engine samples a whole batch with one setting; requests with different settings form sub-batches.
        groups: dict[str, list[int]] = {}
        for index, request in enumerate(requests):
            groups.setdefault(request.sampling.model_dump_json(), []).append(index)
        async with self.engine_lock:
            version = self.engine.weights_version
            for indices in groups.values():
                sampling = requests[indices[0]].sampling
                prompts = [requests[i].prompt_ids for i in indices]
                started = time.perf_counter()
                generations = await asyncio.to_thread(self.engine.generate, prompts, sampling)
                self.generate_s += time.perf_counter() - started
                for i, generation in zip(indices, generations, strict=True):
                    results[i] = GenerateResult(generation=generation, weights_version=version)
        return results

    async def policy(self) -> dict:
        """Replica id, weights version, training iteration and source of this replica."""
        await self._ensure_following()
        return {
            "replica": serve.get_replica_context().replica_id.unique_id,
            "source": self.source,
            "weights_version": self.engine.weights_version,
            "iteration": self.iteration,
            "updates": self.updates,
            "batches": self.batches,
            "requests": self.batched_requests,
            "generate_s": self.generate_s,
        }

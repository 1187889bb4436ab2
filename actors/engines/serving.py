"""Serving engines: concurrent requests streamed token by token, weights swapped between requests.

A :class:`ServingEngine` accepts requests at any time (each with its own sampling settings, ``n``
choices and optional seed) and streams what each choice samples as :class:`ChoiceDelta` lists.
Two continuous implementations: ``ContinuousBatcher`` over the transformers engine's decode step, and
``VLLMServingEngine`` over vLLM's own asynchronous engine; and :class:`BatchServing`, which drives an engine
that has only a batch ``generate`` (a user's engine without a serving form of its own) batch by batch.

The base class owns what both share:

* admission: at most ``max_requests`` requests in flight (decoding or waiting for a row); one more
  raises :class:`QueueFullError` (HTTP 429) instead of queueing without bound;
* weight versions: ``load_weights`` stops admitting, waits until the requests in flight finish on
  the old weights, swaps, then admits again, so one completion never mixes two versions; each
  :class:`CompletionStream` says the version that serves all of it. Any other work that must not overlap
  generation (a broadcast received, the engine put to sleep) runs the same way through ``exclusive``.

Samplers generate through a serving engine too: each episode's turn is one request (``generate``), keyed by the
episode so the engine may keep its keys/values for the next turn.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import numpy as np
import torch

from agentgym_rl.actors.engines.sampling import SamplingParams
from agentgym_rl.actors.weights import WeightsPayload
from agentgym_rl.configs.schema import SamplingConfig

T = TypeVar("T")
# Seeds a request is sampled with stay below this bound (vLLM takes 31-bit seeds); samplers draw each turn's from
# its episode's stream.
SEED_BOUND = 2**31 - 1


@dataclass(frozen=True)
class Generation:
    """One completion: the sampled ids exactly as sampled, and their log-probabilities.

    ``logprobs[i]`` is log p(token_ids[i]) under the temperature-scaled distribution the token was
    drawn from (before top-k/top-p truncation). ``finish_reason`` is ``stop`` when a stop token was
    sampled (it is included in ``token_ids``) or a stop string was completed (the token that
    completed it is the last one kept, so the reply text contains the stop string), and ``length``
    when the per-turn cap was hit.
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]


@dataclass(frozen=True)
class CompletionRequest:
    """One request: ``n`` completions of ``prompt_ids`` sampled with ``params``.

    ``seed`` makes the request reproducible: choice ``c`` draws from a stream seeded by
    ``choice_seed(seed, c)`` whatever else shares the batch. Without it the engine's own stream is used.
    ``key`` names the episode the request is a turn of: an engine with a prefix cache keeps what the turn
    processed under it, for the episode's next turn (``Engine.release`` forgets it). ``stream=False`` asks for
    each choice's tokens at once when it finishes instead of step by step.
    """

    prompt_ids: list[int]
    params: SamplingParams
    n: int = 1
    seed: int | None = None
    key: Hashable | None = None
    stream: bool = True

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError("prompt_ids is empty; a request needs at least one token id")
        if self.n < 1:
            raise ValueError(f"n={self.n}; a request asks for at least one completion")


@dataclass(frozen=True)
class ChoiceDelta:
    """Tokens one choice sampled since its previous delta; ``finish_reason`` is set on its last delta.

    ``logprobs[i]`` is log p(token_ids[i]) under the distribution it was drawn from (temperature and
    penalties applied, before top-k/top-p); ``top_logprobs[i]`` holds the likeliest (token, log-prob)
    pairs of that step when the request asked for them, else it is empty.
    """

    choice: int
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...] = ()
    finish_reason: Literal["stop", "length"] | None = None


class QueueFullError(RuntimeError):
    """The engine already holds its most requests in flight; the caller should retry later."""


def choice_seed(seed: int, choice: int) -> int:
    """The seed of choice ``choice`` of a request seeded with ``seed`` (independent streams per choice)."""
    return int(np.random.SeedSequence([seed % 2**63, choice]).generate_state(1)[0])


def seeded_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


class CompletionStream:
    """An admitted request: the weights version that serves every token of it, and its deltas.

    Iterating yields lists of :class:`ChoiceDelta`: everything sampled since the previous list (a slow
    reader gets several steps at once), until every choice has finished.
    """

    def __init__(self, weights_version: int, deltas: AsyncIterator[list[ChoiceDelta]]) -> None:
        self.weights_version = weights_version
        self._deltas = deltas

    def __aiter__(self) -> AsyncIterator[list[ChoiceDelta]]:
        return self._deltas


class ServingEngine(abc.ABC):
    """Streams completions of concurrent requests; see the module docstring for admission and swaps.

    Args:
        max_requests: requests in flight (decoding or waiting) beyond which :meth:`open` raises
            :class:`QueueFullError`.
    """

    def __init__(self, *, max_requests: int) -> None:
        self.max_requests = max_requests
        self.in_flight = 0
        self.blocked = 0  # requests waiting for a weight swap to end before they are admitted
        # Set while requests are admitted (cleared during a swap) / while none is in flight.
        self._admitting = asyncio.Event()
        self._admitting.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._swap_lock = asyncio.Lock()

    @property
    @abc.abstractmethod
    def weights_version(self) -> int:
        """Version of the weights requests are served with now (0: the source's own)."""

    @property
    @abc.abstractmethod
    def stats(self) -> dict[str, int]:
        """Counters for the policy route: :meth:`admission_stats` and at least ``generated_tokens``."""

    def admission_stats(self) -> dict[str, int]:
        """Requests in flight, and whether a weight swap is waiting for them to finish (1) or not (0)."""
        return {"in_flight": self.in_flight, "swap_pending": int(not self._admitting.is_set())}

    def check(self, request: CompletionRequest) -> None:
        """Raise ``ValueError`` for a request this engine can never serve (by default none)."""

    @contextlib.asynccontextmanager
    async def open(self, request: CompletionRequest) -> AsyncIterator[CompletionStream]:
        """Admit ``request`` and yield its stream; leaving the block (finished, failed or cancelled by a
        client that went away) frees its rows at once.

        Raises:
            QueueFullError: ``max_requests`` requests are already in flight.
            ValueError: see :meth:`check`.
        """
        self.check(request)
        if self.in_flight + self.blocked >= self.max_requests:
            raise QueueFullError(
                f"this replica already has {self.max_requests} requests in flight (serve.max_batch_size + "
                "serve.max_queued_requests); retry shortly"
            )
        self.blocked += 1
        try:
            while not self._admitting.is_set():
                await self._admitting.wait()
        finally:
            self.blocked -= 1
        # No await between the check above and this count: a swap cannot start in between.
        self.in_flight += 1
        self._idle.clear()
        deltas = self._deltas(request)
        try:
            yield CompletionStream(self.weights_version, deltas)
        finally:
            try:
                await deltas.aclose()
            finally:
                self.in_flight -= 1
                if self.in_flight == 0:
                    self._idle.set()

    async def generate(self, request: CompletionRequest) -> tuple[Generation, int]:
        """Run a one-choice ``request`` to its end; returns its completion and the weights version of all of it.

        Raises:
            QueueFullError, ValueError: see :meth:`open`.
        """
        tokens, logprobs, finish = [], [], None
        async with self.open(request) as stream:
            async for deltas in stream:
                for delta in deltas:
                    tokens += delta.token_ids
                    logprobs += delta.logprobs
                    finish = delta.finish_reason or finish
        return Generation(token_ids=tokens, logprobs=logprobs, finish_reason=finish), stream.weights_version

    async def load_weights(self, payload: WeightsPayload) -> None:
        """Serve ``payload``'s weights from the next admitted request on; requests in flight finish on
        the old ones first. A cancelled caller leaves the swap running to its end."""
        await asyncio.shield(self._with_none_in_flight(lambda: self._load(payload)))

    async def exclusive(self, work: Callable[[], T]) -> T:
        """Run ``work`` (in a worker thread) with no request in flight: admitting stops, the requests in flight
        finish, ``work`` runs, admitting resumes. For whatever must not overlap generation: a broadcast received,
        the engine's sleep and wake. A cancelled caller leaves it running to its end."""
        return await asyncio.shield(self._with_none_in_flight(lambda: self._exclusive(work)))

    async def _with_none_in_flight(self, start: Callable[[], Awaitable[T]]) -> T:
        async with self._swap_lock:
            self._admitting.clear()
            try:
                await self._idle.wait()
                return await start()
            finally:
                self._admitting.set()

    async def _exclusive(self, work: Callable[[], T]) -> T:
        """Run ``work`` in a worker thread (called with nothing in flight); an engine whose own loop must run it
        overrides this."""
        return await asyncio.to_thread(work)

    @abc.abstractmethod
    def _deltas(self, request: CompletionRequest) -> AsyncIterator[list[ChoiceDelta]]:
        """An async generator of the request's deltas; closing it early releases whatever it holds."""

    @abc.abstractmethod
    async def _load(self, payload: WeightsPayload) -> None:
        """Adopt ``payload`` (called with nothing in flight)."""


class BatchServing(ServingEngine):
    """The serving form of an engine that has only a batch ``generate``: the requests waiting together (up to
    ``max_rows`` rows with the same settings) go into one ``generate`` call in a worker thread, and requests that
    arrive meanwhile wait for the next call. Rows are not admitted while a call runs, so a short reply waits for
    its batch's longest one; an engine that can admit rows between steps gives itself a ``serving`` form instead.

    Args:
        engine: the engine whose ``generate`` answers the requests.
        max_rows: most rows in one call.
        max_requests: requests in flight beyond which new ones are refused (see ``ServingEngine``).
    """

    def __init__(self, engine: Any, *, max_rows: int, max_requests: int) -> None:
        super().__init__(max_requests=max_requests)
        self.engine = engine
        self.max_rows = max_rows
        self.waiting: deque[tuple[CompletionRequest, asyncio.Future]] = deque()
        self.runner: asyncio.Task | None = None
        self.counters = {"generate_calls": 0, "generated_tokens": 0, "finished": 0}

    @property
    def weights_version(self) -> int:
        return self.engine.weights_version

    @property
    def stats(self) -> dict[str, int]:
        return {**self.counters, **self.admission_stats(), "waiting": len(self.waiting) + self.blocked}

    def check(self, request: CompletionRequest) -> None:
        params = request.params
        if params.penalised or params.top_logprobs:
            raise ValueError(
                f"engine {type(self.engine).__qualname__} has only a batch generate, which takes no presence or "
                "frequency penalty and reports no top_logprobs; leave them out, or give the engine a serving form"
            )
        if request.n > self.max_rows:
            raise ValueError(f"n={request.n} exceeds the {self.max_rows} rows of one generate call; lower n")

    async def _deltas(self, request: CompletionRequest) -> AsyncIterator[list[ChoiceDelta]]:
        future = asyncio.get_running_loop().create_future()
        self.waiting.append((request, future))
        if self.runner is None or self.runner.done():
            self.runner = asyncio.get_running_loop().create_task(self._run())
        generations: list[Generation] = await future
        self.counters["finished"] += 1
        self.counters["generated_tokens"] += sum(len(g.token_ids) for g in generations)
        yield [
            ChoiceDelta(
                choice=choice,
                token_ids=tuple(g.token_ids),
                logprobs=tuple(g.logprobs),
                finish_reason=g.finish_reason,
            )
            for choice, g in enumerate(generations)
        ]

    async def _run(self) -> None:
        while self.waiting:
            settings = self.waiting[0][0].params
            batch, rows, later = [], 0, deque()
            for request, future in self.waiting:
                if future.done():  # its reader went away
                    continue
                if request.params == settings and rows + request.n <= self.max_rows:
                    batch.append((request, future))
                    rows += request.n
                else:
                    later.append((request, future))
            self.waiting = later
            if not batch:
                continue
            prompts, generators, keys = [], [], []
            for request, _ in batch:
                for choice in range(request.n):
                    prompts.append(request.prompt_ids)
                    generators.append(
                        None if request.seed is None else seeded_generator(choice_seed(request.seed, choice))
                    )
                    keys.append(request.key if request.n == 1 else None)
            config = SamplingConfig(
                temperature=settings.temperature,
                top_p=settings.top_p,
                top_k=settings.top_k,
                max_new_tokens=settings.max_new_tokens,
                stop=list(settings.stop),
            )
            seeded = all(generator is not None for generator in generators)
            self.counters["generate_calls"] += 1
            try:
                results = await asyncio.to_thread(
                    self.engine.generate, prompts, config, generators if seeded else None, keys
                )
            except Exception as exc:  # noqa: BLE001 -- every request of the call gets it
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for request, future in batch:
                mine, results = results[: request.n], results[request.n :]
                if not future.done():
                    future.set_result(mine)

    async def _load(self, payload: WeightsPayload) -> None:
        await asyncio.to_thread(self.engine.load_weights, payload)

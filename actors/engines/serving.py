"""Serving engines: concurrent requests streamed token by token, weights swapped between requests.

A :class:`ServingEngine` accepts requests at any time (each with its own sampling settings, ``n``
choices and optional seed) and streams what each choice samples as :class:`ChoiceDelta` lists.
Two implementations: ``ContinuousBatcher`` over the transformers engine's decode step, and
``VLLMServingEngine`` over vLLM's own asynchronous engine.

The base class owns what both share:

* admission: at most ``max_requests`` requests in flight (decoding or waiting for a row); one more
  raises :class:`QueueFullError` (HTTP 429) instead of queueing without bound;
* weight versions: ``load_weights`` stops admitting, waits until the requests in flight finish on
  the old weights, swaps, then admits again, so one completion never mixes two versions; each
  :class:`CompletionStream` says the version that serves all of it.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from agentgym_rl.actors.engines.sampling import SamplingParams
from agentgym_rl.actors.weights import WeightsPayload


@dataclass(frozen=True)
class CompletionRequest:
    """One request: ``n`` completions of ``prompt_ids`` sampled with ``params``.

    ``seed`` makes the request reproducible: choice ``c`` draws from a stream seeded by
    ``choice_seed(seed, c)`` whatever else shares the batch. Without it the engine's own stream is used.
    """

    prompt_ids: list[int]
    params: SamplingParams
    n: int = 1
    seed: int | None = None

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

    async def load_weights(self, payload: WeightsPayload) -> None:
        """Serve ``payload``'s weights from the next admitted request on; requests in flight finish on
        the old ones first. A cancelled caller leaves the swap running to its end."""
        await asyncio.shield(self._swap(payload))

    async def _swap(self, payload: WeightsPayload) -> None:
        async with self._swap_lock:
            self._admitting.clear()
            try:
                await self._idle.wait()
                await self._load(payload)
            finally:
                self._admitting.set()

    @abc.abstractmethod
    def _deltas(self, request: CompletionRequest) -> AsyncIterator[list[ChoiceDelta]]:
        """An async generator of the request's deltas; closing it early releases whatever it holds."""

    @abc.abstractmethod
    async def _load(self, payload: WeightsPayload) -> None:
        """Adopt ``payload`` (called with nothing in flight)."""

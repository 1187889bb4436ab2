"""Continuous batching over the transformers engine's decode step, for serving and for samplers.

One scheduler task owns the engine's model. Each turn of its loop, run in a worker thread so the
event loop keeps accepting requests:

1. drop the rows of requests whose client went away (and of nothing else: finished rows left the
   batch the step they finished);
2. admit waiting requests, first come first served, while the batch has rows and key/value room
   for them: their prompts are prefilled together and merged into the running batch;
3. one :meth:`~actors.engines.decode.DecodeBatch.step` for every row, each with its own settings
   and stream; what it sampled goes to the requests' queues at once.

One request's failure is its own: a row the step fails (see ``decode``) fails its request alone, and
admitted requests whose joint prefill fails are prefilled again one by one, so only the request whose
prompt fails gets the error. Only a failed forward of the decode step itself, which no single
request caused, fails every request of the batch (each with that error).

Key/value memory is bounded: a row reserves ``len(prompt) + max_new_tokens`` positions, and rows
are admitted only while ``rows * longest reservation <= max_kv_tokens`` (the batch is as wide as
its longest row). Weight loads (and any other ``exclusive`` work) run in the same loop, between steps,
when nothing is decoding.

A sampler's turns are keyed requests: a row reuses what the engine's prefix cache holds of its prompt (its
episode's earlier turns, or an opening another episode shares) and, the step it finishes, its keys/values are
copied out of the batch into that cache for the episode's next turn.
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import structlog

from agentgym_rl.actors.engines.base import Engine
from agentgym_rl.actors.engines.decode import Row, RowFailure, StepToken
from agentgym_rl.actors.engines.serving import (
    ChoiceDelta,
    CompletionRequest,
    ServingEngine,
    choice_seed,
    seeded_generator,
)
from agentgym_rl.actors.weights import WeightsPayload

log = structlog.get_logger()
T = TypeVar("T")


@dataclass(eq=False)
class _Pending:
    """A request from submission until its client stops reading."""

    request: CompletionRequest
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    rows: list[Row] = field(default_factory=list)
    abandoned: bool = False
    admitted_at: int = 0  # decode steps taken before its rows joined the batch

    @property
    def reserved(self) -> int:
        """Key/value positions one of its rows can grow to."""
        return len(self.request.prompt_ids) + self.request.params.max_new_tokens


class ContinuousBatcher(ServingEngine):
    """Serves requests from one running decode batch that rows join and leave at every step.

    Args:
        engine: a ``TransformersEngine`` (not imported: it builds this batcher in ``build_serving``), whose
            decode step, stop ids and shared stream it uses (nothing else may call its ``generate`` meanwhile).
        max_rows: most completions decoding at once.
        max_kv_tokens: bound on the batch's key/value positions (rows x longest reserved row).
        max_requests: requests in flight beyond which new ones are refused (see ``ServingEngine``).
    """

    def __init__(self, engine: Engine, *, max_rows: int, max_kv_tokens: int, max_requests: int) -> None:
        super().__init__(max_requests=max_requests)
        self.engine = engine
        self.max_rows = max_rows
        self.max_kv_tokens = max_kv_tokens
        self.batch = engine.decode_batch(keep_finished=False, max_rows=max_rows, max_positions=max_kv_tokens)
        self.waiting: deque[_Pending] = deque()
        self.work: deque[tuple[Callable[[], object], asyncio.Future]] = deque()  # exclusive work, run when idle
        self.wake = asyncio.Event()
        self.scheduler: asyncio.Task | None = None
        self.counters = {
            "steps": 0,
            "generated_tokens": 0,
            "prefill_tokens": 0,
            "finished": 0,
            "abandoned": 0,
            "failed": 0,
            "admitted_while_decoding": 0,  # rows that joined a batch other rows were decoding in
            "overtakes": 0,  # rows that finished while a row admitted before them still decoded
            "peak_rows": 0,
        }

    @property
    def weights_version(self) -> int:
        return self.engine.weights_version

    @property
    def stats(self) -> dict[str, int]:
        return {
            **self.counters,
            **self.admission_stats(),
            "waiting": len(self.waiting) + self.blocked,
            "decoding_rows": len(self.batch.rows),
            "kv_positions": len(self.batch.rows) * self.batch.width,
            "reused_tokens": self.engine.counters["reused_tokens"],
        }

    def check(self, request: CompletionRequest) -> None:
        reserved = len(request.prompt_ids) + request.params.max_new_tokens
        if request.n > self.max_rows or request.n * reserved > self.max_kv_tokens:
            raise ValueError(
                f"a request of n={request.n} x ({len(request.prompt_ids)} prompt + {request.params.max_new_tokens} "
                f"new tokens) can never fit this engine ({self.max_rows} rows, {self.max_kv_tokens} key/value "
                "positions); lower n, max_tokens or the prompt"
            )

    async def _deltas(self, request: CompletionRequest) -> AsyncIterator[list[ChoiceDelta]]:
        pending = _Pending(request)
        self.waiting.append(pending)
        if self.scheduler is None or self.scheduler.done():
            self.scheduler = asyncio.get_running_loop().create_task(self._schedule())
        self.wake.set()
        unfinished = request.n
        try:
            while unfinished:
                items = [await pending.queue.get()]
                while not pending.queue.empty():  # a slow reader takes every step waiting for it at once
                    items.append(pending.queue.get_nowait())
                deltas = []
                for item in items:
                    if isinstance(item, BaseException):
                        raise item
                    deltas.extend(item)
                unfinished -= sum(delta.finish_reason is not None for delta in deltas)
                yield _coalesce(deltas)
        finally:
            if unfinished and not pending.abandoned:  # a failed request was let go already
                pending.abandoned = True
                self.counters["abandoned"] += 1
                self.wake.set()

    async def _load(self, payload: WeightsPayload) -> None:
        await self._exclusive(functools.partial(self.engine.load_weights, payload))

    async def _exclusive(self, work: Callable[[], T]) -> T:
        done = asyncio.get_running_loop().create_future()
        self.work.append((work, done))
        if self.scheduler is None or self.scheduler.done():
            self.scheduler = asyncio.get_running_loop().create_task(self._schedule())
        self.wake.set()
        return await done

    async def _schedule(self) -> None:
        while True:
            self.waiting = deque(p for p in self.waiting if not p.abandoned)
            dropped = [row for row in self.batch.rows if row.tag[0].abandoned]
            live = len(self.batch.rows) - len(dropped)
            if self.work and not live and not self.waiting:
                await self._run_work(dropped)
                continue
            admitted = self._admissible(live)
            if not live and not admitted:
                if dropped:
                    self.batch.drop(dropped)
                self.wake.clear()
                await self.wake.wait()
                continue
            refused: list[tuple[_Pending, Exception]] = []
            try:
                events = await asyncio.to_thread(self._advance, dropped, admitted, refused)
            except Exception as exc:  # the step's forward failed, which no one request caused; serving goes on
                log.exception("decode step failed; failing the requests in the batch")
                for pending in {row.tag[0] for row in self.batch.rows}:
                    self._fail(pending, exc)
                self.batch.drop(list(self.batch.rows))
                continue
            finally:
                for pending, exc in refused:
                    self._fail(pending, exc)
            self._deliver(events)

    def _admissible(self, live: int) -> list[_Pending]:
        """Waiting requests that fit now, in arrival order (the first that does not fit stops the scan)."""
        rows = live
        longest = max((row.tag[0].reserved for row in self.batch.rows if not row.tag[0].abandoned), default=0)
        admitted = []
        while self.waiting:
            pending = self.waiting[0]
            wanted, reach = rows + pending.request.n, max(longest, pending.reserved)
            if wanted > self.max_rows or wanted * reach > self.max_kv_tokens:
                break
            admitted.append(self.waiting.popleft())
            rows, longest = wanted, reach
        return admitted

    def _advance(
        self, dropped: list[Row], admitted: list[_Pending], refused: list[tuple[_Pending, Exception]]
    ) -> list[StepToken | RowFailure]:
        """Worker thread: drop, admit, step; returns the step's events. Admitted requests whose prefill
        failed go to ``refused`` with their errors (told on the event loop, even if the step then fails)."""
        if dropped:
            self.batch.drop(dropped)
        if admitted:
            try:
                self._prefill(admitted)
            except Exception as exc:  # noqa: BLE001 -- told to its request, or to each found at fault
                if len(admitted) == 1:
                    refused.append((admitted[0], exc))
                else:
                    log.warning("joint prefill failed; prefilling the requests one by one", error=str(exc))
                    refused += self._prefill_each(admitted)
        if not self.batch.rows:
            return []
        self.counters["steps"] += 1
        self.counters["peak_rows"] = max(self.counters["peak_rows"], len(self.batch.rows))
        events = self.batch.step()
        finished = [event.row for event in events if isinstance(event, StepToken) and event.finish_reason]
        for row in finished:
            if row.kept is not None:  # a keyed row finished: keep its keys/values for the episode's next turn
                self.engine.keep(row.tag[0].request.key, row.tag[0].request.prompt_ids, row.tokens, row.kept)
                row.kept = None
        # The rows still in the batch decode on; a finished row admitted after one of them overtook it.
        earliest = min((row.tag[0].admitted_at for row in self.batch.rows), default=None)
        if earliest is not None:
            self.counters["overtakes"] += sum(row.tag[0].admitted_at > earliest for row in finished)
        return events

    def _prefill(self, admitted: list[_Pending]) -> None:
        """Prefill the rows of ``admitted`` together and merge them into the batch (which a failure leaves
        as it was: rows are merged only after their forward)."""
        prompts, rows, keys = [], [], []
        for pending in admitted:
            request = pending.request
            stops = self.engine.stop_strings(request.params.stop)
            # Fresh rows (and seeded streams) each try: a request prefilled again samples what it would have.
            pending.rows = [
                Row(
                    params=request.params,
                    generator=None if request.seed is None else seeded_generator(choice_seed(request.seed, choice)),
                    stops=stops,
                    tag=(pending, choice),
                    keep_cache=request.key is not None and request.n == 1 and self.engine.caching,
                )
                for choice in range(request.n)
            ]
            prompts += [request.prompt_ids] * request.n
            rows += pending.rows
            keys += [request.key] * request.n
            pending.admitted_at = self.counters["steps"]
        if self.batch.rows:
            self.counters["admitted_while_decoding"] += len(rows)
        self.counters["prefill_tokens"] += self.engine.admit(self.batch, prompts, rows, keys)

    def _prefill_each(self, admitted: list[_Pending]) -> list[tuple[_Pending, Exception]]:
        """Prefill each request alone; returns those that fail, with their errors."""
        refused = []
        for pending in admitted:
            try:
                self._prefill([pending])
            except Exception as exc:  # noqa: BLE001 -- this request's own error, told to it
                refused.append((pending, exc))
        return refused

    def _fail(self, pending: _Pending, exc: Exception) -> None:
        """End ``pending`` with ``exc`` (its reader raises it); its other rows leave at the next turn."""
        if not pending.abandoned:
            pending.abandoned = True
            self.counters["failed"] += 1
            pending.queue.put_nowait(exc)

    def _deliver(self, events: list[StepToken | RowFailure]) -> None:
        tokens = []
        for event in events:
            if isinstance(event, RowFailure):
                self._fail(event.row.tag[0], event.error)
            else:
                tokens.append(event)
        self.counters["generated_tokens"] += len(tokens)
        per_request: dict[_Pending, list[ChoiceDelta]] = {}
        for token in tokens:
            pending, choice = token.row.tag
            if token.finish_reason is not None:
                self.counters["finished"] += 1
            if pending.request.stream:
                delta = ChoiceDelta(
                    choice=choice,
                    token_ids=(token.token_id,),
                    logprobs=(token.logprob,),
                    top_logprobs=(token.top_logprobs,) if token.row.params.top_logprobs else (),
                    finish_reason=token.finish_reason,
                )
            elif token.finish_reason is not None:  # the whole choice at once
                row = token.row
                delta = ChoiceDelta(
                    choice=choice,
                    token_ids=tuple(row.tokens),
                    logprobs=tuple(row.logprobs),
                    top_logprobs=tuple(row.top_logprobs),
                    finish_reason=token.finish_reason,
                )
            else:
                continue
            per_request.setdefault(pending, []).append(delta)
        for pending, deltas in per_request.items():
            if not pending.abandoned:
                pending.queue.put_nowait(deltas)

    async def _run_work(self, dropped: list[Row]) -> None:
        work, done = self.work.popleft()

        def run() -> object:
            self.batch.drop(dropped)
            return work()

        try:
            result = await asyncio.to_thread(run)
        except Exception as exc:  # noqa: BLE001 -- the caller of exclusive gets it
            done.set_exception(exc)
        else:
            done.set_result(result)


def _coalesce(deltas: list[ChoiceDelta]) -> list[ChoiceDelta]:
    """One delta per choice, in choice order, from several steps' deltas."""
    merged: dict[int, ChoiceDelta] = {}
    for delta in deltas:
        before = merged.get(delta.choice)
        if before is None:
            merged[delta.choice] = delta
            continue
        merged[delta.choice] = ChoiceDelta(
            choice=delta.choice,
            token_ids=before.token_ids + delta.token_ids,
            logprobs=before.logprobs + delta.logprobs,
            top_logprobs=before.top_logprobs + delta.top_logprobs,
            finish_reason=delta.finish_reason,
        )
    return [merged[choice] for choice in sorted(merged)]

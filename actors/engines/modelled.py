"""The modelled engine: a simulation of a GPU engine for scale benchmarks. No model runs.

A reply is drawn, not computed: a length from a log-normal distribution, filler ids, then ``Action: <action>`` and
the end-of-turn id, so that an env accepts it and episodes play to their end. Time passes as a GPU engine with
continuous batching would spend it (``configs.schema.ModelledEngineConfig``): rows join the running batch between
decode steps, a step of ``r`` rows costs ``decode_step_s + decode_row_s * r``, and a joining row's uncached prompt
ids stall the batch for ``prefill_token_s`` each. The engine sleeps through that time, so one CPU core hosts many
simulated engines: the rest of the system (driver, samplers, env actors, Ray) runs for real around them.

Nothing it writes is evidence of learning: ``agentgym-rl eval``, ``compare`` and the experiment stages refuse it
(``configs.engines.refuse_simulated``), and a run with it plays no held-out tasks.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Hashable
from dataclasses import dataclass, field

import numpy as np
import torch
from typing_extensions import override

from agentgym_rl.actors.engines.base import Engine, EngineSpec
from agentgym_rl.actors.engines.sampling import SamplingParams
from agentgym_rl.actors.engines.serving import (
    ChoiceDelta,
    CompletionRequest,
    Generation,
    ServingEngine,
    choice_seed,
)
from agentgym_rl.actors.model_store import load_tokenizer
from agentgym_rl.actors.weights import WeightsPayload
from agentgym_rl.configs.schema import ModelledEngineConfig, SamplingConfig

FILLER = " Let me think about which step brings me closer to the goal."


class ModelledEngine(Engine):
    """Draws replies and models their GPU time (see the module docstring); :meth:`serving` is its continuous form.

    Counters (``stats``): ``prefill_tokens`` and ``reused_tokens`` as every engine's, ``generated_tokens``,
    ``decode_steps``, ``row_steps`` (rows summed over steps) and ``modelled_ms`` (simulated compute time).
    """

    def __init__(self, spec: EngineSpec) -> None:
        self.settings: ModelledEngineConfig = spec.modelled
        tokenizer = load_tokenizer(spec.model_name)
        self.filler = tokenizer.encode(FILLER, add_special_tokens=False)
        self.actions = [tokenizer.encode(f"\nAction: {a}", add_special_tokens=False) for a in self.settings.actions]
        self.stop_id = spec.stop_token_ids[0]
        self.rng = np.random.default_rng(spec.seed)
        self.processed: dict[Hashable, int] = {}  # episode key -> ids its last turn left cached
        self.stats = {
            "prefill_tokens": 0,
            "reused_tokens": 0,
            "generated_tokens": 0,
            "decode_steps": 0,
            "row_steps": 0,
            "modelled_ms": 0,
        }
        self.weights_version = 0

    @classmethod
    @override
    def build(cls, spec: EngineSpec) -> ModelledEngine:
        return cls(spec)

    # ----------------------------------------------------------------------------- replies and their cost

    def reply(self, rng: np.random.Generator, max_new_tokens: int) -> Generation:
        """One drawn reply: filler up to a log-normal length, then an action line and the end-of-turn id; cut at
        ``max_new_tokens`` (then ``finish_reason`` is ``length``)."""
        settings = self.settings
        action = self.actions[int(rng.integers(len(self.actions)))]
        length = max(1, round(settings.reply_tokens_median * math.exp(settings.reply_tokens_sigma * rng.normal())))
        fill = max(0, length - len(action) - 1)
        ids = [*(self.filler * (fill // len(self.filler) + 1))[:fill], *action, self.stop_id]
        finish = "stop"
        if len(ids) > max_new_tokens:
            ids, finish = ids[:max_new_tokens], "length"
        # Log-probabilities of a plausible size: a reply's tokens are mostly likely ones.
        logprobs = (-rng.exponential(0.3, size=len(ids))).tolist()
        return Generation(token_ids=ids, logprobs=logprobs, finish_reason=finish)

    def prefill(self, prompt: list[int], key: Hashable | None) -> int:
        """Count ``prompt``'s ids to prefill (those beyond what ``key``'s previous turn left cached); returns them."""
        cached = min(self.processed.get(key, 0), len(prompt)) if key is not None else 0
        self.stats["reused_tokens"] += cached
        self.stats["prefill_tokens"] += len(prompt) - cached
        return len(prompt) - cached

    def finish(self, key: Hashable | None, prompt: list[int], reply: Generation) -> None:
        """Remember what the turn left cached for its episode's next turn, and count the reply."""
        self.stats["generated_tokens"] += len(reply.token_ids)
        if key is not None:
            self.processed[key] = len(prompt) + len(reply.token_ids)

    def step_seconds(self, rows: int) -> float:
        return self.settings.decode_step_s + self.settings.decode_row_s * rows

    def spend(self, seconds: float, steps: int = 0, rows: int = 0) -> None:
        self.stats["modelled_ms"] += round(seconds * 1000)
        self.stats["decode_steps"] += steps
        self.stats["row_steps"] += steps * rows

    # ----------------------------------------------------------------------------- the Engine interface

    @override
    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingConfig,
        generators: list[torch.Generator] | None = None,
        keys: list[Hashable | None] | None = None,
    ) -> list[Generation]:
        """The whole batch as one: its prefill, then steps until its longest reply ends (no row joins)."""
        self.check_batch(prompts, generators, keys)
        keys = keys or [None] * len(prompts)
        rngs = [
            np.random.default_rng(int(g.initial_seed())) if g is not None else self.rng
            for g in (generators or [None] * len(prompts))
        ]
        replies = [self.reply(rng, sampling.max_new_tokens) for rng in rngs]
        prefill = sum(self.prefill(p, k) for p, k in zip(prompts, keys, strict=True)) * self.settings.prefill_token_s
        steps = max(len(r.token_ids) for r in replies)
        seconds = prefill + steps * self.step_seconds(len(prompts))
        time.sleep(seconds)
        self.spend(seconds, steps, len(prompts))
        for prompt, key, reply in zip(prompts, keys, replies, strict=True):
            self.finish(key, prompt, reply)
        return replies

    @override
    def serving(self, *, max_rows: int, max_kv_tokens: int, max_requests: int) -> ModelledServing:
        return ModelledServing(self, max_rows=max_rows, max_requests=max_requests)

    @override
    def release(self, key: Hashable) -> None:
        self.processed.pop(key, None)

    @override
    def load_tensors(self, tensors: dict[str, torch.Tensor], version: int, lora_scale: float | None) -> None:
        self.weights_version = version


@dataclass
class Row:
    """One completion in the modelled batch: the steps it still needs and who waits for it."""

    reply: Generation
    steps_left: int
    done: asyncio.Future = field(repr=False)


class ModelledServing(ServingEngine):
    """Continuous batching in simulated time: requests join between steps (their prefill stalls the batch), each
    step advances every row by one token, a row leaves when its reply is done. Between arrivals the loop sleeps
    until the next row finishes, so a long stretch of steps costs one timer, not one wake-up per step."""

    def __init__(self, engine: ModelledEngine, *, max_rows: int, max_requests: int) -> None:
        super().__init__(max_requests=max_requests)
        self.engine = engine
        self.max_rows = max_rows
        self.waiting: list[tuple[CompletionRequest, list[Row]]] = []
        self.rows: list[Row] = []
        self.arrived: asyncio.Event | None = None
        self.runner: asyncio.Task | None = None

    @property
    def weights_version(self) -> int:
        return self.engine.weights_version

    @property
    def stats(self) -> dict[str, int]:
        return {**self.engine.stats, **self.admission_stats(), "waiting": len(self.waiting) + self.blocked}

    @override
    def check(self, request: CompletionRequest) -> None:
        if request.n > self.max_rows:
            raise ValueError(f"n={request.n} exceeds the {self.max_rows} rows of the batch; lower n")

    @override
    async def _deltas(self, request: CompletionRequest) -> AsyncIterator[list[ChoiceDelta]]:
        loop = asyncio.get_running_loop()
        params: SamplingParams = request.params
        rows = []
        for choice in range(request.n):
            rng = (
                np.random.default_rng(choice_seed(request.seed, choice))
                if request.seed is not None
                else self.engine.rng
            )
            reply = self.engine.reply(rng, params.max_new_tokens)
            rows.append(Row(reply, len(reply.token_ids), loop.create_future()))
        self.waiting.append((request, rows))
        if self.arrived is None:
            self.arrived = asyncio.Event()
        self.arrived.set()
        if self.runner is None or self.runner.done():
            self.runner = loop.create_task(self._run())
        replies = [await row.done for row in rows]
        for reply in replies:
            self.engine.finish(request.key if request.n == 1 else None, request.prompt_ids, reply)
        yield [
            ChoiceDelta(
                choice=c, token_ids=tuple(r.token_ids), logprobs=tuple(r.logprobs), finish_reason=r.finish_reason
            )
            for c, r in enumerate(replies)
        ]

    async def _run(self) -> None:
        engine = self.engine
        while self.rows or self.waiting:
            prefill = 0
            while self.waiting and len(self.rows) + len(self.waiting[0][1]) <= self.max_rows:
                request, rows = self.waiting.pop(0)
                if all(row.done.cancelled() for row in rows):  # its reader went away
                    continue
                key = request.key if request.n == 1 else None
                prefill += engine.prefill(request.prompt_ids, key) * len(rows)
                self.rows += rows
            if prefill:
                seconds = prefill * engine.settings.prefill_token_s
                await asyncio.sleep(seconds)
                engine.spend(seconds)
            if not self.rows:
                continue
            step = engine.step_seconds(len(self.rows))
            most = min(row.steps_left for row in self.rows)
            self.arrived.clear()
            start = time.monotonic()
            try:
                await asyncio.wait_for(self.arrived.wait(), timeout=most * step)
                # A request arrived mid-step: finish the step it interrupted, then let it join.
                steps = min(most, math.ceil((time.monotonic() - start) / step))
                await asyncio.sleep(max(0.0, start + steps * step - time.monotonic()))
            except TimeoutError:
                steps = most
            engine.spend(steps * step, steps, len(self.rows))
            for row in self.rows:
                row.steps_left -= steps
            for row in [row for row in self.rows if row.steps_left <= 0]:
                self.rows.remove(row)
                if not row.done.done():
                    row.done.set_result(row.reply)

    @override
    async def _load(self, payload: WeightsPayload) -> None:
        self.engine.weights_version = payload.version

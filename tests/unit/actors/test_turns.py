"""Turns through an engine's serving form, the way a sampler generates (``Engine.serving``, ``ServingEngine.generate``),
on both engines, without Ray.

Each turn enters the engine when it is submitted and comes back when its own reply is done: a short turn that
arrives while a long reply decodes finishes first. Keyed turns of episodes that open alike share the opening's
keys/values in the transformers engine's prefix cache and sample what they would without it.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from agentgym_rl.actors.engines import CompletionRequest, SamplingParams
from tests.unit.actors.helpers import tiny_engine
from tests.unit.actors.test_engine import ENGINES

LONG, SHORT = 96, 4


@pytest.fixture(scope="module", params=ENGINES)
def engine(request, tokenizer):
    # A stop id the random model does not sample in these few steps: every reply runs to its cap.
    engine = tiny_engine(tokenizer, request.param, stop_token_ids=[0], max_cached_tokens=4096)
    yield engine
    close = getattr(engine, "close", None)
    if close is not None:
        close()  # vLLM's engine processes would otherwise outlive this module


def test_a_turn_ready_while_a_long_reply_decodes_finishes_before_it(engine):
    serving = engine.serving(max_rows=4, max_kv_tokens=4096, max_requests=8)
    finished: list[str] = []
    long_tokens: list[int] = []

    async def long_turn():
        request = CompletionRequest([1, 2, 3, 4, 5], SamplingParams(max_new_tokens=LONG), seed=1, key="long")
        async with serving.open(request) as stream:
            async for deltas in stream:
                long_tokens.extend(t for d in deltas for t in d.token_ids)
        finished.append("long")

    async def short_turn():
        while len(long_tokens) < 8:  # the long reply is decoding
            await asyncio.sleep(0.001)
        request = CompletionRequest([9, 8, 7], SamplingParams(max_new_tokens=SHORT), seed=2, key="short", stream=False)
        generation, _ = await serving.generate(request)
        finished.append("short")
        return generation, len(long_tokens)

    async def play():
        return await asyncio.gather(long_turn(), short_turn())

    _, (short, long_so_far) = asyncio.run(play())
    assert finished == ["short", "long"]
    assert len(short.token_ids) == SHORT and short.finish_reason == "length"
    assert long_so_far < LONG  # the short turn did not wait for the long reply's end
    assert len(long_tokens) == LONG


def test_a_turn_samples_what_its_seed_gives_whatever_else_is_decoding(engine):
    serving = engine.serving(max_rows=4, max_kv_tokens=4096, max_requests=8)
    params = SamplingParams(max_new_tokens=12)
    request = CompletionRequest([4, 5, 6, 7], params, seed=11, stream=False)

    async def alone():
        return await serving.generate(request)

    async def beside_others():
        others = [CompletionRequest([3] * (5 + i), params, seed=100 + i, stream=False) for i in range(3)]
        results = await asyncio.gather(*(serving.generate(r) for r in [*others, request]))
        return results[-1]

    first, _ = asyncio.run(alone())
    second, _ = asyncio.run(beside_others())
    assert first.token_ids == second.token_ids


def test_episodes_that_open_alike_share_the_opening_and_sample_what_they_would_without_it(tokenizer):
    opening = list(range(100, 180))  # a system prompt of 80 ids (5 whole blocks of 16)
    prompts = {"a": opening + [7, 8, 9], "b": opening + [21, 22]}
    params = SamplingParams(max_new_tokens=6)

    def play(cached_tokens: int):
        engine = tiny_engine(tokenizer, max_cached_tokens=cached_tokens)
        serving = engine.serving(max_rows=4, max_kv_tokens=4096, max_requests=8)

        async def turns():
            out = {}
            for key, prompt in prompts.items():  # one after the other: b starts once a's entry is stored
                out[key], _ = await serving.generate(CompletionRequest(prompt, params, seed=5, key=key, stream=False))
            return out

        return asyncio.run(turns()), engine.stats

    shared, stats = play(4096)
    plain, plain_stats = play(0)
    assert stats["shared_tokens"] == len(opening)  # b reused all of a's opening (a, the first, had nothing to reuse)
    assert stats["prefill_tokens"] == plain_stats["prefill_tokens"] - len(opening)
    assert plain_stats["shared_tokens"] == 0
    for key in prompts:
        assert shared[key].token_ids == plain[key].token_ids
        assert shared[key].logprobs == pytest.approx(plain[key].logprobs, abs=1e-4)


def test_episodes_admitted_together_prefill_their_common_opening_once(tokenizer):
    opening = list(range(300, 364))  # 4 whole blocks
    prompts = {"a": opening + [7, 8, 9], "b": opening + [21, 22], "c": opening[:40] + [5] * 30}
    params = SamplingParams(max_new_tokens=5)

    def play(cached_tokens: int):
        engine = tiny_engine(tokenizer, max_cached_tokens=cached_tokens)
        serving = engine.serving(max_rows=4, max_kv_tokens=4096, max_requests=8)

        async def turns():  # all three wait together, so they are admitted in one prefill
            requests = [CompletionRequest(p, params, seed=9, key=k, stream=False) for k, p in prompts.items()]
            return dict(zip(prompts, await asyncio.gather(*(serving.generate(r) for r in requests)), strict=True))

        return asyncio.run(turns()), engine.stats

    shared, stats = play(4096)
    plain, plain_stats = play(0)
    assert plain_stats["prefill_tokens"] == sum(len(p) for p in prompts.values())
    # The 40 ids all three open with are prefilled once, then each prompt's own rest.
    assert stats["prefill_tokens"] == 40 + sum(len(p) - 40 for p in prompts.values())
    for key in prompts:
        assert shared[key][0].token_ids == plain[key][0].token_ids


def test_exclusive_work_waits_for_the_turns_in_flight_and_holds_new_ones_back(tokenizer):
    engine = tiny_engine(tokenizer, max_cached_tokens=4096)
    serving = engine.serving(max_rows=4, max_kv_tokens=4096, max_requests=8)
    order: list[str] = []

    async def play():
        long = asyncio.ensure_future(
            serving.generate(CompletionRequest([1, 2, 3], SamplingParams(max_new_tokens=40), seed=1, stream=False))
        )
        long.add_done_callback(lambda _: order.append("long done"))
        while not serving.in_flight or not serving.counters["steps"]:
            await asyncio.sleep(0.001)
        work = asyncio.ensure_future(serving.exclusive(lambda: order.append("work")))
        await asyncio.sleep(0)  # the work is waiting now: admitting stopped
        later = asyncio.ensure_future(
            serving.generate(CompletionRequest([4, 5], SamplingParams(max_new_tokens=3), seed=2, stream=False))
        )
        later.add_done_callback(lambda _: order.append("later done"))
        await asyncio.gather(long, work, later)

    asyncio.run(play())
    assert order == ["long done", "work", "later done"]
    assert torch.is_tensor(next(iter(engine.model.parameters())))

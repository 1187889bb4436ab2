"""Continuous batching over the transformers engine's decode step (the serving engine), without Ray.

Rows join and leave a running batch at every step, each with its own settings and stream; a seeded
request samples exactly what the sampler's ``generate`` samples from the same stream, which is the
proof that both drive one decode step.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from agentgym_rl.actors.engines import CompletionRequest, QueueFullError, SamplingParams
from agentgym_rl.actors.engines.continuous import ContinuousBatcher
from agentgym_rl.actors.engines.serving import choice_seed, seeded_generator
from agentgym_rl.actors.model_store import load_model
from agentgym_rl.actors.weights import pack_state_dict
from agentgym_rl.configs.schema import SamplingConfig
from tests.unit.actors.helpers import tiny_engine


def new_engine(tokenizer):
    return tiny_engine(tokenizer)


@pytest.fixture(scope="module")
def reference(tokenizer):
    """A separate engine that answers one prompt at a time with ``generate``."""
    return new_engine(tokenizer)


def batcher(tokenizer, *, max_rows: int = 8, max_kv_tokens: int = 4096, max_requests: int = 16) -> ContinuousBatcher:
    return ContinuousBatcher(
        new_engine(tokenizer), max_rows=max_rows, max_kv_tokens=max_kv_tokens, max_requests=max_requests
    )


def alone(engine, request: CompletionRequest, choice: int = 0):
    """What the sampler's ``generate`` samples for one choice of ``request`` from the same stream."""
    p = request.params
    config = SamplingConfig(
        temperature=p.temperature, top_k=p.top_k, top_p=p.top_p, max_new_tokens=p.max_new_tokens, stop=list(p.stop)
    )
    generator = seeded_generator(choice_seed(request.seed, choice))
    return engine.generate([request.prompt_ids], config, [generator])[0]


async def collect(engine: ContinuousBatcher, request: CompletionRequest, log: list | None = None, name: str = ""):
    """Read a request to its end; returns ({choice: (ids, logprobs, tops, finish)}, weights version)."""
    out = {c: ([], [], [], None) for c in range(request.n)}
    async with engine.open(request) as stream:
        async for deltas in stream:
            for delta in deltas:
                ids, lps, tops, _ = out[delta.choice]
                ids.extend(delta.token_ids)
                lps.extend(delta.logprobs)
                tops.extend(delta.top_logprobs)
                out[delta.choice] = (ids, lps, tops, delta.finish_reason)
                if log is not None:
                    log.append((name, engine.counters["steps"], delta.finish_reason))
    return out, stream.weights_version


async def after_steps(engine: ContinuousBatcher, steps: int) -> None:
    while engine.counters["steps"] < steps:
        await asyncio.sleep(0.001)


def test_rows_with_their_own_settings_join_a_running_batch_and_sample_what_generate_samples(tokenizer, reference):
    requests = [
        CompletionRequest([1, 2, 3, 4, 5], SamplingParams(temperature=0.7, max_new_tokens=12), seed=1),
        CompletionRequest([9, 8], SamplingParams(top_k=1, max_new_tokens=5), seed=2),
        CompletionRequest([7] * 20, SamplingParams(temperature=1.3, top_p=0.8, max_new_tokens=9), n=2, seed=3),
        CompletionRequest([5, 5, 5], SamplingParams(max_new_tokens=15, top_k=40), seed=4),
    ]
    engine = batcher(tokenizer)
    log: list = []

    async def run(index: int, request: CompletionRequest):
        await after_steps(engine, 2 * index)  # request i joins once the batch has run 2i steps
        return await collect(engine, request, log, str(index))

    async def main():
        return await asyncio.gather(*(run(i, r) for i, r in enumerate(requests)))

    results = asyncio.run(main())
    for request, (out, version) in zip(requests, results, strict=True):
        assert version == 0
        for choice in range(request.n):
            ids, lps, _, finish = out[choice]
            expected = alone(reference, request, choice)
            assert ids == expected.token_ids and finish == expected.finish_reason
            assert torch.allclose(torch.tensor(lps), torch.tensor(expected.logprobs), atol=1e-5)
    # The choices of request 2 differ (own streams), and later requests joined while earlier ones ran.
    assert results[2][0][0][0] != results[2][0][1][0]
    first_step = {name: min(step for n, step, _ in log if n == name) for name in "0123"}
    last_step = {name: max(step for n, step, _ in log if n == name) for name in "0123"}
    assert first_step["3"] < last_step["0"], (first_step, last_step)
    assert engine.counters["steps"] < sum(len(out[c][0]) for out, _ in results for c in out)
    assert engine.stats["decoding_rows"] == 0 and engine.stats["in_flight"] == 0


def test_penalties_and_top_logprobs_follow_their_definitions(tokenizer):
    """Greedy rows with penalties against a full forward per step; top_logprobs are that step's top-k."""
    model = load_model("tiny-random")
    prompt = [3, 4, 5, 6]
    penalised = SamplingParams(top_k=1, max_new_tokens=10, presence_penalty=0.5, frequency_penalty=0.7, top_logprobs=3)
    plain = SamplingParams(top_k=1, max_new_tokens=10, top_logprobs=3)
    engine = batcher(tokenizer)

    async def main():
        return await asyncio.gather(
            collect(engine, CompletionRequest(prompt, penalised)), collect(engine, CompletionRequest(prompt, plain))
        )

    (with_penalty, _), (without, _) = asyncio.run(main())
    for params, (ids, lps, tops, _) in ((penalised, with_penalty[0]), (plain, without[0])):
        counts = torch.zeros(model.config.vocab_size)
        for step, token in enumerate(ids):
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([prompt + ids[:step]])).logits[0, -1]
            logits = logits - params.frequency_penalty * counts - params.presence_penalty * (counts > 0)
            logprobs = torch.log_softmax(logits, -1)
            assert token == int(logits.argmax())
            assert lps[step] == pytest.approx(float(logprobs[token]), abs=1e-4)
            values, indices = torch.topk(logprobs, 3)
            assert [t for t, _ in tops[step]] == indices.tolist()
            assert [v for _, v in tops[step]] == pytest.approx(values.tolist(), abs=1e-4)
            counts[token] += 1
    # tiny-random's greedy reply repeats tokens; the penalties break the repetition.
    assert len(set(without[0][0])) < len(without[0][0])
    assert with_penalty[0][0] != without[0][0]


def test_a_request_whose_reader_goes_away_leaves_the_batch_at_once(tokenizer, reference):
    engine = batcher(tokenizer)
    stay = CompletionRequest([1, 2, 3], SamplingParams(max_new_tokens=30), seed=5)
    leave = CompletionRequest([4, 5, 6, 7], SamplingParams(max_new_tokens=200), seed=6)

    async def leaver():
        async with engine.open(leave) as stream:
            async for _ in stream:
                if engine.counters["steps"] >= 3:
                    break  # the client went away
        return engine.counters["steps"]

    async def main():
        return await asyncio.gather(collect(engine, stay), leaver())

    (out, _), left_at = asyncio.run(main())
    assert out[0][0] == alone(reference, stay).token_ids  # its neighbour leaving changes nothing
    assert engine.counters["abandoned"] == 1 and engine.stats["decoding_rows"] == 0
    # The abandoned row was dropped at the next step: far fewer than its 200 tokens were generated.
    assert engine.counters["generated_tokens"] <= len(out[0][0]) + left_at + 1


def test_key_value_memory_is_bounded_and_a_request_that_does_not_fit_waits(tokenizer):
    first = CompletionRequest([1] * 10, SamplingParams(max_new_tokens=20), seed=1)
    second = CompletionRequest([2] * 10, SamplingParams(max_new_tokens=20), seed=2)
    engine = batcher(tokenizer, max_kv_tokens=45)  # one row of 10 + 20 fits, two do not (2 x 30 = 60)
    log: list = []
    peak = 0

    async def watch():
        nonlocal peak
        while engine.in_flight or not log:
            peak = max(peak, engine.stats["kv_positions"])
            await asyncio.sleep(0.001)

    async def main():
        await asyncio.gather(collect(engine, first, log, "a"), collect(engine, second, log, "b"), watch())

    asyncio.run(main())
    a_done = next(i for i, (name, _, finish) in enumerate(log) if name == "a" and finish)
    b_first = next(i for i, (name, _, _) in enumerate(log) if name == "b")
    assert a_done < b_first
    assert 0 < peak <= 45
    with pytest.raises(ValueError, match="can never fit"):
        asyncio.run(collect(engine, CompletionRequest([3] * 40, SamplingParams(max_new_tokens=10))))


def test_beyond_max_requests_a_request_is_refused(tokenizer):
    engine = batcher(tokenizer, max_rows=1, max_requests=2)
    long = SamplingParams(max_new_tokens=50)

    async def main():
        async with engine.open(CompletionRequest([1, 2], long)), engine.open(CompletionRequest([3, 4], long)):
            with pytest.raises(QueueFullError, match="2 requests in flight"):
                async with engine.open(CompletionRequest([5, 6], long)):
                    pass
        async with engine.open(CompletionRequest([5, 6], SamplingParams(max_new_tokens=2))) as stream:
            return [delta async for deltas in stream for delta in deltas]

    assert len(asyncio.run(main())) == 2  # the slots are free again once the two readers left


def test_a_weight_swap_waits_for_running_requests_and_no_completion_mixes_versions(tokenizer, reference):
    model = load_model("tiny-random")
    original = pack_state_dict(model.state_dict(), version=0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(0.5)
    engine = batcher(tokenizer)
    running = CompletionRequest([1, 2, 3, 4], SamplingParams(max_new_tokens=24), seed=11)
    later = CompletionRequest([1, 2, 3, 4], SamplingParams(max_new_tokens=24), seed=11)

    async def main():
        before = asyncio.create_task(collect(engine, running))
        await after_steps(engine, 3)
        swap = asyncio.create_task(engine.load_weights(pack_state_dict(model.state_dict(), version=1)))
        await asyncio.sleep(0)
        after = asyncio.create_task(collect(engine, later))  # asked for while the swap waits
        await swap
        return await before, await after

    (old_out, old_version), (new_out, new_version) = asyncio.run(main())
    assert (old_version, new_version) == (0, 1)
    assert old_out[0][0] == alone(reference, running).token_ids
    try:
        reference.load_weights(pack_state_dict(model.state_dict(), version=1))
        assert new_out[0][0] == alone(reference, later).token_ids
    finally:
        reference.load_weights(original)
    assert old_out[0][0] != new_out[0][0]

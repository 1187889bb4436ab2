"""One request never fails another: vanishing sampling settings are greedy, and a request whose prompt
fails (in the prefill, or with non-finite probabilities) fails alone while its batch goes on (no Ray)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from agentgym_rl.actors.engines import CompletionRequest, SamplingParams
from agentgym_rl.actors.engines.continuous import ContinuousBatcher
from agentgym_rl.actors.engines.decode import RowFailedError
from agentgym_rl.actors.engines.sampling import GREEDY_BELOW, filter_logits
from tests.unit.actors.helpers import tiny_engine

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8)


@pytest.mark.parametrize(
    "settings", [{"temperature": 1e-300}, {"temperature": 5e-324}, {"temperature": 1e-45}, {"top_p": 1e-300}]
)
def test_a_vanishing_temperature_or_top_p_is_greedy_decoding(settings):
    assert SamplingParams(max_new_tokens=8, **settings) == GREEDY
    assert (GREEDY.temperature, GREEDY.top_p, GREEDY.top_k) == (1.0, 1.0, 1)
    above = SamplingParams(temperature=GREEDY_BELOW, top_p=GREEDY_BELOW)
    assert (above.temperature, above.top_p, above.top_k) == (GREEDY_BELOW, GREEDY_BELOW, 0)


def test_nucleus_filtering_keeps_the_likeliest_token_whatever_top_p_rounds_to():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    kept = filter_logits(logits, top_k=0, top_p=1e-300)  # 1e-300 is 0 in float32
    probs = torch.softmax(kept, dim=-1)
    assert torch.isfinite(probs).all()
    assert torch.equal(probs.argmax(dim=-1), logits.argmax(dim=-1))
    assert torch.equal((probs > 0).sum(dim=-1), torch.ones(3, dtype=torch.long))


async def read(engine: ContinuousBatcher, request: CompletionRequest) -> list[int] | BaseException:
    """The ids of a one-choice request, or the error it ended with."""
    ids: list[int] = []
    try:
        async with engine.open(request) as stream:
            async for deltas in stream:
                for delta in deltas:
                    ids.extend(delta.token_ids)
    except Exception as exc:  # noqa: BLE001 -- the error is the request's outcome here
        return exc
    return ids


def test_a_request_whose_prompt_fails_fails_alone_and_its_batch_goes_on(tokenizer):
    engine = tiny_engine(tokenizer)
    vocab = engine.model.config.vocab_size
    poisoned = 17
    embeddings = engine.model.get_input_embeddings()
    with torch.no_grad():  # a prompt with token 17 gets NaN logits, as a half-precision overflow would give
        engine.model.lm_head.weight = torch.nn.Parameter(embeddings.weight.clone())  # untied: output stays finite
        embeddings.weight[poisoned] = float("nan")
    batcher = ContinuousBatcher(engine, max_rows=8, max_kv_tokens=4096, max_requests=8)
    healthy = [
        CompletionRequest([1, 2, 3, 4], SamplingParams(temperature=0.8, max_new_tokens=12), seed=1),
        CompletionRequest([9, 8, 7], SamplingParams(top_p=0.9, max_new_tokens=10), seed=2),
    ]
    bad_probabilities = CompletionRequest([5, poisoned, 6], SamplingParams(max_new_tokens=10), seed=3)
    bad_prefill = CompletionRequest([5, vocab + 5, 6], SamplingParams(max_new_tokens=10), seed=4)

    async def main():
        # Gathered: all four are admitted in one turn, so they share one prefill and one batch.
        together = [healthy[0], bad_probabilities, bad_prefill, healthy[1]]
        return await asyncio.gather(*(read(batcher, r) for r in together)), [await read(batcher, r) for r in healthy]

    (first, failed_row, failed_prefill, second), alone = asyncio.run(main())
    assert isinstance(failed_row, RowFailedError), failed_row
    assert isinstance(failed_prefill, IndexError), failed_prefill
    assert [first, second] == alone
    assert all(len(ids) > 0 for ids in (first, second))
    assert batcher.counters["failed"] == 2 and batcher.counters["abandoned"] == 0
    assert batcher.stats["decoding_rows"] == 0 and batcher.stats["in_flight"] == 0

"""The transformers engine's per-episode key/value reuse: same results, bounded memory, dropped on release
and on new weights; and its stop tokens."""

from __future__ import annotations

import pytest
import torch

from agentgym_rl.actors.model_store import load_model
from agentgym_rl.actors.weights import pack_state_dict
from agentgym_rl.configs.schema import SamplingConfig
from tests.unit.actors.helpers import tiny_engine

SAMPLING = SamplingConfig(max_new_tokens=10)
# Different lengths, so that cached prefixes and new suffixes are both ragged within a batch.
OPENINGS = [[1, 2, 3, 4, 5, 6, 7], [9, 8], [7] * 30, [5, 5, 5], [11, 12, 13, 14]]


def make(tokenizer, cached_tokens: int, stop_token_ids: list[int] | None = None):
    return tiny_engine(tokenizer, stop_token_ids=stop_token_ids, max_cached_tokens=cached_tokens)


def play(engine, keys, turns: int = 4, diverge_at: int | None = None):
    """Multi-turn rows: each turn's prompt is the last prompt + the reply + a message of 1-3 ids.
    With ``diverge_at``, row 0's history is edited at that turn (its cache only partly matches)."""
    generators = [torch.Generator().manual_seed(100 + row) for row in range(len(OPENINGS))]
    prompts = [list(p) for p in OPENINGS]
    results = []
    for turn in range(turns):
        if turn == diverge_at:
            prompts[0][3] = 99
        generations = engine.generate(prompts, SAMPLING, generators, keys)
        results.append(generations)
        prompts = [
            prompt + generation.token_ids + [20 + turn] * (1 + row % 3)
            for row, (prompt, generation) in enumerate(zip(prompts, generations, strict=True))
        ]
    return results


def assert_same(a, b):
    for turn_a, turn_b in zip(a, b, strict=True):
        for x, y in zip(turn_a, turn_b, strict=True):
            assert x.token_ids == y.token_ids and x.finish_reason == y.finish_reason
            assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-5)


@pytest.fixture(scope="module")
def without_reuse(tokenizer):
    return play(make(tokenizer, 0), keys=None)


def test_reuse_samples_the_same_ids_and_logprobs_and_prefills_only_new_ids(tokenizer, without_reuse):
    engine = make(tokenizer, 100_000)
    keys = ["a", "b", None, "d", "e"]  # one row never reuses: a mixed batch
    with_reuse = play(engine, keys)
    assert_same(with_reuse, without_reuse)
    # Turns 2..4 of the four keyed rows prefill only the reply's last id and the message.
    assert engine.stats["reused_tokens"] > engine.stats["prefill_tokens"] / 2
    assert len(engine.kv_cache) == 4
    for key in keys:
        if key is not None:
            engine.release(key)
    assert engine.stats["cached_tokens"] == 0 and len(engine.kv_cache) == 0


def test_a_history_that_changed_reuses_only_the_common_prefix(tokenizer):
    plain = play(make(tokenizer, 0), keys=None, diverge_at=2)
    engine = make(tokenizer, 100_000)
    assert_same(play(engine, keys=["a", "b", "c", "d", "e"], diverge_at=2), plain)


def test_a_small_budget_evicts_least_recently_used_episodes_and_changes_nothing(tokenizer, without_reuse):
    engine = make(tokenizer, 120)
    assert_same(play(engine, keys=["a", "b", "c", "d", "e"]), without_reuse)
    assert engine.stats["cache_evictions"] > 0
    assert 0 < engine.stats["cached_tokens"] <= 120


def test_new_weights_drop_every_cached_episode(tokenizer):
    engine = make(tokenizer, 100_000)
    prompt = [1, 2, 3, 4, 5]
    first = engine.generate([prompt], SAMPLING, [torch.Generator().manual_seed(1)], keys=["a"])[0]
    assert engine.stats["cached_tokens"] > 0
    model = load_model("tiny-random")
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(0.5)
    engine.load_weights(pack_state_dict(model.state_dict(), version=1))
    assert engine.stats["cached_tokens"] == 0
    # The next turn is computed from scratch with the new weights: it matches a fresh engine that has them.
    fresh = make(tokenizer, 0)
    fresh.load_weights(pack_state_dict(model.state_dict(), version=1))
    follow = prompt + first.token_ids + [30, 31]
    reused = engine.generate([follow], SAMPLING, [torch.Generator().manual_seed(2)], keys=["a"])[0]
    expected = fresh.generate([follow], SAMPLING, [torch.Generator().manual_seed(2)])[0]
    assert reused.token_ids == expected.token_ids
    assert torch.allclose(torch.tensor(reused.logprobs), torch.tensor(expected.logprobs), atol=1e-5)


def test_each_row_stops_at_its_own_stop_token(tokenizer):
    greedy = SamplingConfig(max_new_tokens=6, top_k=1)
    free = make(tokenizer, 0).generate(OPENINGS, greedy)
    stop = free[0].token_ids[2]
    stopped = make(tokenizer, 0, stop_token_ids=[stop]).generate(OPENINGS, greedy)
    for before, after in zip(free, stopped, strict=True):
        if stop in before.token_ids:
            cut = before.token_ids.index(stop) + 1
            assert after.token_ids == before.token_ids[:cut] and after.finish_reason == "stop"
        else:
            assert after.token_ids == before.token_ids and after.finish_reason == "length"
    assert stopped[0].finish_reason == "stop"

"""The prefix cache's bookkeeping (``PrefixKVCache``) with small hand-made tensors, no model."""

from __future__ import annotations

import torch

from agentgym_rl.actors.engines.kv_cache import BLOCK_TOKENS, CachedPrefix, PrefixKVCache, block_hashes


def entry(ids: list[int]) -> CachedPrefix:
    """An entry whose key tensor at position i holds ids[i], so a lookup's slice shows which positions it took."""
    keys = torch.tensor(ids, dtype=torch.float32).reshape(1, -1, 1)  # (H_kv=1, T, D=1)
    return CachedPrefix(ids=list(ids), layers=[(keys, keys.clone())])


def test_block_hashes_stand_for_whole_prefixes():
    a = list(range(3 * BLOCK_TOKENS + 5))
    b = list(range(2 * BLOCK_TOKENS)) + [99] * (BLOCK_TOKENS + 5)
    assert len(block_hashes(a)) == 3  # the 5 ids past the last whole block are not hashed
    assert block_hashes(a)[:2] == block_hashes(b)[:2]
    assert block_hashes(a)[2] != block_hashes(b)[2]
    assert block_hashes(list(range(BLOCK_TOKENS - 1))) == []


def test_a_key_reuses_its_own_entry_and_a_new_key_the_longest_shared_prefix():
    cache = PrefixKVCache(max_tokens=1000)
    opening = list(range(1000, 1048))  # three blocks
    cache.store("a", entry(opening + [1, 2, 3]))
    cache.store("b", entry(opening[:16] + [5] * 20))
    # Own entry: everything it holds that the prompt extends.
    reused, layers = cache.lookup("a", opening + [1, 2, 3, 4])
    assert reused == len(opening) + 3
    assert layers[0][0].flatten().tolist() == opening + [1, 2, 3]
    assert cache.shared_tokens == 0
    # A new episode: the entry with the longest whole-block prefix ("a", three blocks), then id by id within it.
    reused, layers = cache.lookup("c", opening + [1, 2, 7])
    assert reused == len(opening) + 2
    assert layers[0][0].flatten().tolist() == opening + [1, 2]
    assert cache.shared_tokens == len(opening) + 2
    # The last prompt id is always left to prefill.
    reused, _ = cache.lookup(None, opening)
    assert reused == len(opening) - 1


def test_nothing_is_shared_below_one_block_and_released_or_evicted_entries_share_nothing():
    cache = PrefixKVCache(max_tokens=100)
    cache.store("a", entry(list(range(40))))
    assert cache.lookup("x", list(range(10)) + [77]) == (0, None)  # under one whole block in common
    assert cache.lookup("x", list(range(20)) + [77])[0] == 20
    cache.release("a")
    assert cache.lookup("x", list(range(20)) + [77]) == (0, None)
    assert cache.tokens == 0
    cache.store("b", entry(list(range(60))))
    cache.store("c", entry([5] * 60))  # evicts b: 120 > 100
    assert "b" not in cache and cache.evictions == 1
    assert cache.lookup("x", list(range(40))) == (0, None)
    cache.clear()
    assert cache.lookup("x", [5] * 30) == (0, None) and len(cache) == 0

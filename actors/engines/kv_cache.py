"""Key/value caches kept between turns, and shared between episodes that start alike.

An episode's next prompt is its previous prompt, the sampled reply and the environment's message:
it extends what the model already processed. And episodes of one run start alike: the same system
prompt (in tool format, the env's functions, hundreds of tokens), and in a group the same first
observation. :class:`PrefixKVCache` keeps, per episode key, the ids that were run through the model and
their per-layer keys and values. A turn reuses its own episode's entry; an episode's first turn reuses the
longest prefix any entry holds, found by hashing the prompt in blocks of :data:`BLOCK_TOKENS` ids chained
from the start (as vLLM's and SGLang's prefix caches key their blocks), so the shared opening is prefilled
once per weights version. Entries are evicted least-recently-used beyond a token budget and dropped by
``release`` when the episode ends; the whole store is cleared when the weights change (the cached values
were computed with the old ones).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass

import torch
from transformers import PretrainedConfig

# Ids per block of the prefix index: a prompt shares whole blocks with an earlier entry (the rest is matched
# id by id in that entry), so a small block finds nearly all of a shared opening at a small cost per turn.
BLOCK_TOKENS = 16


def kv_bytes_per_token(config: PretrainedConfig, dtype: torch.dtype) -> int:
    """Bytes of keys and values one token position takes over all layers of a model with ``config``:
    layers x 2 (keys, values) x key/value heads x head dimension x ``dtype``'s size."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return config.num_hidden_layers * 2 * heads * head_dim * dtype.itemsize


@dataclass
class CachedPrefix:
    """Ids already run through the model for one episode and their keys/values.

    ``layers[l]`` is ``(keys, values)``, each ``(H_kv, len(ids), D)``, positions ``0 .. len(ids)-1``.
    """

    ids: list[int]
    layers: list[tuple[torch.Tensor, torch.Tensor]]


def common_prefix_length(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two id lists."""
    limit = min(len(a), len(b))
    if a[:limit] == b[:limit]:  # the usual case: one extends the other (a C-speed comparison)
        return limit
    index = 0
    while a[index] == b[index]:
        index += 1
    return index


def block_hashes(ids: list[int]) -> list[int]:
    """Chained hashes of the full :data:`BLOCK_TOKENS`-id blocks of ``ids``: entry ``k`` stands for the first
    ``(k + 1) * BLOCK_TOKENS`` ids (equal hashes mean equal prefixes, up to a collision, which lookups check)."""
    hashes, running = [], 0
    for start in range(0, len(ids) - BLOCK_TOKENS + 1, BLOCK_TOKENS):
        running = hash((running, tuple(ids[start : start + BLOCK_TOKENS])))
        hashes.append(running)
    return hashes


class PrefixKVCache:
    """A token-bounded LRU store of :class:`CachedPrefix` by episode key, whose entries any episode may reuse
    a prefix of; safe to use from two threads (the engine's decode thread stores and reads, the sampler's
    event loop releases).

    Args:
        max_tokens: most cached token positions over all episodes; 0 disables the store.
    """

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self._entries: OrderedDict[Hashable, CachedPrefix] = OrderedDict()
        # Block hash -> the keys whose entries hold that prefix (insertion-ordered: the newest last).
        self._holders: dict[int, dict[Hashable, None]] = {}
        self._hashes: dict[Hashable, list[int]] = {}
        self._tokens = 0
        self._lock = threading.Lock()
        self.evictions = 0
        self.shared_tokens = 0  # prompt ids served from another episode's entry

    @property
    def tokens(self) -> int:
        """Token positions cached now, over all episodes."""
        return self._tokens

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def lookup(
        self, key: Hashable | None, prompt: list[int]
    ) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]] | None]:
        """How many leading ids of ``prompt`` are cached, and their keys/values: from ``key``'s own entry, or
        where ``key`` has none (an episode's first turn, or a request without a key) from the entry holding
        the longest prefix of ``prompt`` in whole blocks.

        At least the last prompt id is always left to prefill (its logits start the reply), so the
        reused length is below ``len(prompt)``. Returns ``(0, None)`` when nothing can be reused.
        """
        with self._lock:
            entry = self._entries.get(key) if key is not None else None
            if entry is not None:
                self._entries.move_to_end(key)
                reuse = common_prefix_length(entry.ids, prompt)
            else:
                entry, reuse = self._longest_shared(prompt)
        reuse = min(reuse, len(prompt) - 1)
        if entry is None or reuse <= 0:
            return 0, None
        return reuse, [(k[:, :reuse], v[:, :reuse]) for k, v in entry.layers]

    def held(self, prompt: list[int]) -> int:
        """How many leading ids of ``prompt`` some entry holds (found as a new episode's lookup finds them), without
        counting it as a use."""
        with self._lock:
            holder = self._holder(prompt)
            return 0 if holder is None else common_prefix_length(self._entries[holder].ids, prompt)

    def _holder(self, prompt: list[int]) -> Hashable | None:
        """The key of the newest entry holding the most whole blocks of ``prompt`` (called with the lock held)."""
        holder = None
        for digest in block_hashes(prompt):
            keys = self._holders.get(digest)
            if not keys:
                break
            holder = next(reversed(keys))
        return holder

    def _longest_shared(self, prompt: list[int]) -> tuple[CachedPrefix | None, int]:
        """The entry that holds the longest whole-block prefix of ``prompt`` and how much of ``prompt`` it holds
        (called with the lock held)."""
        holder = self._holder(prompt)
        if holder is None:
            return None, 0
        entry = self._entries[holder]
        self._entries.move_to_end(holder)
        reuse = common_prefix_length(entry.ids, prompt)  # also rules out a hash collision
        self.shared_tokens += min(reuse, len(prompt) - 1)
        return entry, reuse

    def store(self, key: Hashable, prefix: CachedPrefix) -> None:
        """Keep ``prefix`` for ``key`` (replacing its previous entry), evicting the least recently used
        entries beyond the token budget; a prefix larger than the whole budget is not kept."""
        size = len(prefix.ids)
        with self._lock:
            self._drop(key)
            if size == 0 or size > self.max_tokens:
                return
            while self._tokens + size > self.max_tokens:
                self._drop(next(iter(self._entries)))
                self.evictions += 1
            self._entries[key] = prefix
            self._tokens += size
            self._hashes[key] = block_hashes(prefix.ids)
            for digest in self._hashes[key]:
                self._holders.setdefault(digest, {})[key] = None

    def release(self, key: Hashable) -> None:
        """Forget ``key`` (its episode ended); unknown keys are ignored."""
        with self._lock:
            self._drop(key)

    def clear(self) -> None:
        """Forget every episode (the weights changed)."""
        with self._lock:
            self._entries.clear()
            self._holders.clear()
            self._hashes.clear()
            self._tokens = 0

    def _drop(self, key: Hashable) -> None:
        entry = self._entries.pop(key, None)
        if entry is None:
            return
        self._tokens -= len(entry.ids)
        for digest in self._hashes.pop(key):
            keys = self._holders[digest]
            del keys[key]
            if not keys:
                del self._holders[digest]

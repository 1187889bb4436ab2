"""Per-episode key/value caches kept between the turns of multi-turn episodes.

An episode's next prompt is its previous prompt, the sampled reply and the environment's message:
it extends what the model already processed. :class:`EpisodeKVCache` keeps, per episode key, the ids
that were run through the model and their per-layer keys and values, so the engine prefills only the
new suffix. Entries are evicted least-recently-used beyond a token budget and dropped by ``release``
when the episode ends; the whole store is cleared when the weights change (the cached values were
computed with the old ones).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass

import torch
from transformers import PretrainedConfig


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


class EpisodeKVCache:
    """A token-bounded LRU store of :class:`CachedPrefix` by episode key; safe to use from two threads
    (the engine's generate thread stores and reads, the sampler's event loop releases).

    Args:
        max_tokens: most cached token positions over all episodes; 0 disables the store.
    """

    def __init__(self, max_tokens: int) -> None:
        self.max_tokens = max_tokens
        self._entries: OrderedDict[Hashable, CachedPrefix] = OrderedDict()
        self._tokens = 0
        self._lock = threading.Lock()
        self.evictions = 0

    @property
    def tokens(self) -> int:
        """Token positions cached now, over all episodes."""
        return self._tokens

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def lookup(self, key: Hashable, prompt: list[int]) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]] | None]:
        """How many leading ids of ``prompt`` are cached for ``key``, and their keys/values.

        At least the last prompt id is always left to prefill (its logits start the reply), so the
        reused length is below ``len(prompt)``. Returns ``(0, None)`` when nothing can be reused.
        """
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return 0, None
            self._entries.move_to_end(key)
        reuse = min(common_prefix_length(entry.ids, prompt), len(prompt) - 1)
        if reuse <= 0:
            return 0, None
        return reuse, [(k[:, :reuse], v[:, :reuse]) for k, v in entry.layers]

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

    def release(self, key: Hashable) -> None:
        """Forget ``key`` (its episode ended); unknown keys are ignored."""
        with self._lock:
            self._drop(key)

    def clear(self) -> None:
        """Forget every episode (the weights changed)."""
        with self._lock:
            self._entries.clear()
            self._tokens = 0

    def _drop(self, key: Hashable) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._tokens -= len(entry.ids)

"""Batched sampling with a Hugging Face causal LM on CPU or one GPU.

A hand-written decode loop instead of ``model.generate``: it keeps the exact sampled ids and
their log-probabilities, stops each row on its own stop token or stop string, draws from seeded
``torch.Generator`` streams so that one config seed reproduces a run, and reuses each episode's
keys/values from its previous turn so a turn prefills only the ids that are new since then (the
batch layout with cached prefixes is drawn in ``decode.prefill_inputs``). The step itself is
:class:`~actors.engines.decode.DecodeBatch`, which the server's continuous batching drives too.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable, Iterable

import structlog
import torch
from transformers import DynamicCache, PreTrainedTokenizerBase
from transformers.cache_utils import DynamicLayer
from typing_extensions import override

from agentgym_rl.actors.adapters import AdapterMerger, read_checked_adapter
from agentgym_rl.actors.engines.attention import use_decode_attention
from agentgym_rl.actors.engines.base import Engine, EngineSpec, Generation
from agentgym_rl.actors.engines.continuous import ContinuousBatcher
from agentgym_rl.actors.engines.decode import DecodeBatch, Row
from agentgym_rl.actors.engines.kv_cache import (
    BLOCK_TOKENS,
    CachedPrefix,
    PrefixKVCache,
    block_hashes,
    common_prefix_length,
    kv_bytes_per_token,
)
from agentgym_rl.actors.engines.sampling import SamplingParams, StopStrings
from agentgym_rl.actors.engines.serving import ServingEngine
from agentgym_rl.actors.model_store import load_model, load_tokenizer
from agentgym_rl.configs.schema import SamplingConfig

log = structlog.get_logger()


class TransformersEngine(Engine):
    """Engine over a transformers model.

    Args:
        model_name: built-in name or local Hugging Face directory.
        dtype: ``float32`` or ``bfloat16``.
        seed: seeds the sampling generator.
        stop_token_ids: ids that end a turn (the tokenizer's end-of-turn / eos ids).
        pad_token_id: id used for padding (never sampled into results).
        max_cached_tokens: token positions of per-episode keys/values kept between turns (all episodes
            together); 0 re-prefills every prompt. Models with sliding-window layers never reuse.
        adapter: a LoRA adapter directory whose base is ``model_name``, applied at start.
        fit_cache_to_memory: on a GPU keep at most the positions that half the memory free after the model
            loads holds (``max_cached_tokens`` is then a bound, not a promise).
    """

    def __init__(
        self,
        *,
        model_name: str,
        dtype: str,
        seed: int,
        stop_token_ids: list[int],
        pad_token_id: int,
        max_cached_tokens: int = 0,
        adapter: str | None = None,
        fit_cache_to_memory: bool = False,
    ) -> None:
        self.model_name = model_name
        self.model = load_model(model_name, dtype)
        if self.model.config._attn_implementation == "sdpa":
            use_decode_attention(self.model)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.model.to(self.device)
        self.merger = AdapterMerger(self.model)
        if adapter is not None:
            saved = read_checked_adapter(adapter, model_name)
            self.merger.apply(saved.tensors, saved.scale)
        self.stop_token_ids = torch.tensor(sorted(set(stop_token_ids)), device=self.device)
        self.pad_token_id = pad_token_id
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        self.weights_version = 0
        # Cached keys of a sliding-window layer would need the window re-applied per row; such models re-prefill.
        full_attention = all(type(layer) is DynamicLayer for layer in DynamicCache(config=self.model.config).layers)
        budget = max_cached_tokens if full_attention else 0
        if fit_cache_to_memory and self.device.type == "cuda":
            budget = min(budget, self._tokens_in_free_memory(asked=budget))
        self.kv_cache = PrefixKVCache(budget)
        self.counters = {"prefill_tokens": 0, "reused_tokens": 0}

    @classmethod
    @override
    def build(cls, spec: EngineSpec) -> TransformersEngine:
        return cls(
            model_name=spec.model_name,
            dtype=spec.dtype,
            seed=spec.seed,
            stop_token_ids=spec.stop_token_ids,
            pad_token_id=spec.pad_token_id,
            max_cached_tokens=spec.max_cached_tokens,
            adapter=spec.adapter,
            fit_cache_to_memory=spec.fit_cache_to_memory,
        )

    @classmethod
    @override
    def build_serving(cls, spec: EngineSpec, *, max_rows: int, max_kv_tokens: int, max_requests: int) -> ServingEngine:
        """Continuous batching over this engine's decode step (``ContinuousBatcher``)."""
        return cls.build(spec).serving(max_rows=max_rows, max_kv_tokens=max_kv_tokens, max_requests=max_requests)

    @override
    def serving(self, *, max_rows: int, max_kv_tokens: int, max_requests: int) -> ServingEngine:
        """Continuous batching over this engine's decode step (``ContinuousBatcher``); keyed requests reuse and
        keep keys/values in this engine's prefix cache."""
        return ContinuousBatcher(self, max_rows=max_rows, max_kv_tokens=max_kv_tokens, max_requests=max_requests)

    def _tokens_in_free_memory(self, asked: int) -> int:
        """Key/value positions that half the GPU memory free now holds: a decode batch copies the positions
        it reuses into its own cache, so the other half is for it (and its activations)."""
        free, _ = torch.cuda.mem_get_info(self.device)
        fit = free // 2 // kv_bytes_per_token(self.model.config, self.model.dtype)
        log.info("key/value cache sized by free GPU memory", asked=asked, fits=fit, free_gib=round(free / 2**30, 1))
        return fit

    @property
    def stats(self) -> dict[str, int]:
        """Prompt ids prefilled and reused so far (``shared_tokens``: reused from another episode's entry), and the
        cache's current size and evictions."""
        return {
            **self.counters,
            "shared_tokens": self.kv_cache.shared_tokens,
            "cached_tokens": self.kv_cache.tokens,
            "cache_evictions": self.kv_cache.evictions,
        }

    @functools.cached_property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The model's tokenizer, loaded on first use (only stop strings need it)."""
        return load_tokenizer(self.model_name)

    def release(self, key: Hashable) -> None:
        self.kv_cache.release(key)

    def decode_batch(
        self, *, keep_finished: bool, max_rows: int | None = None, max_positions: int | None = None
    ) -> DecodeBatch:
        """An empty batch over this engine's model, stop ids and shared stream (see :class:`DecodeBatch`)."""
        return DecodeBatch(
            self.model,
            stop_token_ids=self.stop_token_ids,
            pad_token_id=self.pad_token_id,
            generator=self.generator,
            keep_finished=keep_finished,
            max_rows=max_rows,
            max_positions=max_positions,
        )

    def stop_strings(self, stops: tuple[str, ...]) -> StopStrings | None:
        """A matcher of ``stops`` (None when there are none; the tokenizer loads on first use)."""
        return StopStrings(self.tokenizer, list(stops)) if stops else None

    @torch.inference_mode()
    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingConfig,
        generators: list[torch.Generator] | None = None,
        keys: list[Hashable | None] | None = None,
    ) -> list[Generation]:
        self.check_batch(prompts, generators, keys)
        if not prompts:
            return []
        batch = len(prompts)
        params = SamplingParams.from_config(sampling)
        stops = self.stop_strings(params.stop)
        rows = [
            Row(params=params, generator=None if generators is None else generators[i], stops=stops)
            for i in range(batch)
        ]
        # Finished rows stay as masked padding: the batch keeps one shape from prefill to the end.
        decode = self.decode_batch(keep_finished=True)
        keys = keys if keys is not None else [None] * batch
        self.admit(decode, prompts, rows, keys)
        while decode.running:
            decode.step()
        if failed := [row.failure for row in rows if row.failure is not None]:
            raise failed[0]
        for index, (key, prompt, row) in enumerate(zip(keys, prompts, rows, strict=True)):
            if key is not None and self.caching:
                self.keep(key, prompt, row.tokens, decode.row_cache(index))
        return [
            Generation(token_ids=row.tokens, logprobs=row.logprobs, finish_reason=row.finish_reason) for row in rows
        ]

    @property
    def caching(self) -> bool:
        """Whether keys/values are kept between turns (a token budget above 0)."""
        return self.kv_cache.max_tokens > 0

    def admit(self, batch: DecodeBatch, prompts: list[list[int]], rows: list[Row], keys: list[Hashable | None]) -> int:
        """Prefill ``prompts`` into ``batch`` as ``rows``, each reusing what the prefix cache holds of it (its
        key's own entry, or the longest prefix another entry shares); returns the prompt ids run through the
        model."""
        if self.caching:
            self._prefill_openings(prompts, keys)
        reused = [
            self.kv_cache.lookup(key, prompt) if self.caching else (0, None)
            for key, prompt in zip(keys, prompts, strict=True)
        ]
        prefilled = batch.add(prompts, rows, reused)
        self.counters["prefill_tokens"] += prefilled
        self.counters["reused_tokens"] += sum(length for length, _ in reused)
        return prefilled

    def _prefill_openings(self, prompts: list[list[int]], keys: list[Hashable | None]) -> None:
        """Episodes admitted together that open alike beyond what the cache holds (a group's first turns, or the
        first episodes of a run, all under one system prompt) would each prefill their common opening in the same
        forward: prefill it once, alone, and keep it as the first such episode's entry, so that all of them reuse
        it (the entry is replaced by that episode's own turn when it ends)."""
        fresh: dict[int, list[tuple[Hashable, list[int]]]] = {}
        for key, prompt in zip(keys, prompts, strict=True):
            if key is not None and key not in self.kv_cache and len(prompt) > BLOCK_TOKENS:
                fresh.setdefault(block_hashes(prompt[:BLOCK_TOKENS])[0], []).append((key, prompt))
        for members in fresh.values():
            if len(members) < 2:
                continue
            key, first = members[0]
            # The common opening, leaving each member at least its last id to prefill (its logits start the reply).
            length = min(min(common_prefix_length(first, p), len(p) - 1) for _, p in members[1:])
            if length - self.kv_cache.held(first) < BLOCK_TOKENS:
                continue
            opening = first[:length]
            batch = self.decode_batch(keep_finished=True)
            reused = self.kv_cache.lookup(None, opening)
            self.counters["prefill_tokens"] += batch.add([opening], [Row(params=SamplingParams())], [reused])
            self.counters["reused_tokens"] += reused[0]
            # (H_kv, length, D) each, out of the batch's buffers (which have room beyond them)
            layers = [(layer.keys[0].contiguous(), layer.values[0].contiguous()) for layer in batch.cache.layers]
            self.kv_cache.store(key, CachedPrefix(ids=opening, layers=layers))

    def keep(
        self, key: Hashable, prompt: list[int], reply: list[int], layers: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> None:
        """Store what a keyed row processed (``prompt`` + ``reply`` minus its last token) with its keys/values
        ``layers`` (per layer, each ``(H_kv, len(ids), D)``) for the key's next turn and for episodes that start
        alike."""
        ids = prompt + reply[:-1]
        assert all(k.shape[1] == len(ids) for k, _ in layers), "cache columns and processed ids disagree"
        self.kv_cache.store(key, CachedPrefix(ids=ids, layers=layers))

    def load_tensors(self, tensors: dict[str, torch.Tensor], version: int, lora_scale: float | None) -> None:
        """Adopt ``tensors``. On CPU the parameters become the tensors themselves (no copy); for a payload
        from the object store those view its arrays in shared memory, so a load is nearly free and every
        sampler and server on a node reads one copy of the weights. The arrays are read-only; inference
        never writes them. Adapter tensors are merged into the base weights this engine holds (see
        ``AdapterMerger``)."""
        if lora_scale is not None:
            self.merger.apply(tensors, lora_scale)
            self._adopt(version)
        else:
            self.load_buckets([list(tensors.items())], version)

    def load_buckets(self, buckets: Iterable[list[tuple[str, torch.Tensor]]], version: int) -> None:
        """Load full weights a bucket at a time, each as it arrives (copied into the parameters, or on CPU
        adopted as they are).

        Raises:
            ValueError: a tensor this model lacks, or a weight of the model in no bucket (the model may then
                hold a mix of versions; the next full load replaces every weight).
        """
        expected = self.model.state_dict()
        loaded: set[str] = set()
        for bucket in buckets:
            tensors = dict(bucket)
            unknown = sorted(tensors.keys() - expected.keys())
            if unknown:
                raise ValueError(f"weights {unknown[:5]} are not in {self.model_name}; load weights of that model")
            # Views need the tensors in the model's own dtype; otherwise load_state_dict copies and casts.
            same_dtype = all(t.dtype == expected[name].dtype for name, t in tensors.items())
            self.model.load_state_dict(tensors, strict=False, assign=self.device.type == "cpu" and same_dtype)
            loaded.update(tensors)
        missing = sorted(expected.keys() - loaded)
        if missing:
            raise ValueError(f"the weights lack {missing[:5]} ({len(missing)} in all) of {self.model_name}")
        self.merger = AdapterMerger(self.model)  # later adapters apply to these weights
        self._adopt(version)

    def _adopt(self, version: int) -> None:
        self.kv_cache.clear()  # cached keys/values were computed with the old weights
        self.weights_version = version

    @property
    def weights_device(self) -> torch.device:
        return self.device

    def sleep(self) -> None:
        """Drop the cached keys/values; on a GPU also move the weights to host memory. The adapters' bases
        live there already (see ``AdapterMerger``), so nothing of the model or its adapters stays on the GPU."""
        self.kv_cache.clear()
        if self.device.type == "cuda":
            self.model.to("cpu")
            torch.cuda.empty_cache()

    def wake(self) -> None:
        self.model.to(self.device)

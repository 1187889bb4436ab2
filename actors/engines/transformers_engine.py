"""Batched sampling with a Hugging Face causal LM on CPU or one GPU.

A hand-written decode loop instead of ``model.generate``: it keeps the exact sampled ids and
their log-probabilities, stops each row on its own stop token or stop string, draws from seeded
``torch.Generator`` streams so that one config seed reproduces a run, and reuses each episode's
keys/values from its previous turn so a turn prefills only the ids that are new since then.

How a batch with different cached lengths is laid out (one forward for the whole prefill)::

    columns:  [ cached prefix, right-aligned in C | new suffix, left-aligned... right-aligned in S ]
    row 0:      . . k k k k k                        . . s s s        (reused 5, new 3)
    row 1:      . . . . . . .                        s s s s s        (no cache: a fresh prompt)
    row 2:      k k k k k k k                        . . . . s        (reused 7, new 1)

Padding columns are masked out and never attended; position ids are each row's true positions, so
the logits equal those of a full prefill of the whole prompt (up to float rounding).
"""

from __future__ import annotations

import functools
from collections.abc import Hashable

import torch
from transformers import DynamicCache, PreTrainedTokenizerBase
from transformers.cache_utils import DynamicLayer

from actors.engines.base import Engine, Generation
from actors.engines.kv_cache import CachedPrefix, EpisodeKVCache
from actors.engines.sampling import StopStrings, filter_logits
from actors.models import load_model, load_tokenizer
from actors.weights import WeightsPayload, unpack_state_dict
from configs.schema import SamplingConfig

KV = list[tuple[torch.Tensor, torch.Tensor]]


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
    ) -> None:
        self.model_name = model_name
        self.model = load_model(model_name, dtype)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.model.to(self.device)
        self.stop_token_ids = torch.tensor(sorted(set(stop_token_ids)), device=self.device)
        self.pad_token_id = pad_token_id
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        self.weights_version = 0
        # Cached keys of a sliding-window layer would need the window re-applied per row; such models re-prefill.
        full_attention = all(type(layer) is DynamicLayer for layer in DynamicCache(config=self.model.config).layers)
        self.kv_cache = EpisodeKVCache(max_cached_tokens if full_attention else 0)
        self.counters = {"prefill_tokens": 0, "reused_tokens": 0}

    @property
    def stats(self) -> dict[str, int]:
        """Prompt ids prefilled and reused so far, and the cache's current size and evictions."""
        return {**self.counters, "cached_tokens": self.kv_cache.tokens, "cache_evictions": self.kv_cache.evictions}

    @functools.cached_property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The model's tokenizer, loaded on first use (only stop strings need it)."""
        return load_tokenizer(self.model_name)

    def release(self, key: Hashable) -> None:
        self.kv_cache.release(key)

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
        keys = keys if keys is not None and self.kv_cache.max_tokens > 0 else [None] * batch
        reused = [
            self.kv_cache.lookup(key, prompt) if key is not None else (0, None)
            for key, prompt in zip(keys, prompts, strict=True)
        ]
        input_ids, attention, positions, cache = self._prefill_inputs(prompts, reused)
        self.counters["reused_tokens"] += sum(length for length, _ in reused)
        self.counters["prefill_tokens"] += sum(len(p) - length for p, (length, _) in zip(prompts, reused, strict=True))
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,  # only the last position's logits: the full (B, T, V) tensor would dwarf the cache
        )
        next_logits = out.logits[:, -1, :].float()  # (B, V)
        positions = positions[:, -1:]  # (B, 1)

        stops = StopStrings(self.tokenizer, sampling.stop) if sampling.stop else None
        tokens: list[list[int]] = [[] for _ in range(batch)]
        logprobs: list[list[float]] = [[] for _ in range(batch)]
        stopped_by_string = [False] * batch
        finished = torch.zeros(batch, dtype=torch.bool, device=self.device)
        for step in range(sampling.max_new_tokens):
            scaled = next_logits / sampling.temperature
            step_logprobs = torch.log_softmax(scaled, dim=-1)  # (B, V)
            probs = torch.softmax(filter_logits(scaled, sampling.top_k, sampling.top_p), dim=-1)
            running = (~finished).nonzero().flatten().tolist()
            if generators is None:
                sampled = torch.multinomial(probs, 1, generator=self.generator).squeeze(-1)  # (B,)
            else:
                # One stream per row, drawn only while the row runs: a row's samples do not depend
                # on which other rows share the batch or how long they run.
                sampled = torch.full((batch,), self.pad_token_id, dtype=torch.long, device=self.device)
                row_probs = probs.to(generators[0].device)  # episode streams are CPU generators, also on a GPU
                for row in running:
                    sampled[row] = torch.multinomial(row_probs[row], 1, generator=generators[row])[0]
            sampled_lp = step_logprobs.gather(-1, sampled[:, None]).squeeze(-1)  # (B,)
            for row in running:
                tokens[row].append(int(sampled[row]))
                logprobs[row].append(float(sampled_lp[row]))
                if stops is not None and stops.completed(tokens[row]):
                    stopped_by_string[row] = True
                    finished[row] = True
            finished |= torch.isin(sampled, self.stop_token_ids)
            # The last sampled token of every row is never fed back: the cache ends just before it.
            if bool(finished.all()) or step == sampling.max_new_tokens - 1:
                break
            sampled = sampled.masked_fill(finished, self.pad_token_id)
            attention = torch.cat([attention, (~finished).long()[:, None]], dim=-1)
            positions = positions + 1
            out = self.model(
                input_ids=sampled[:, None],
                attention_mask=attention,
                position_ids=positions,
                past_key_values=out.past_key_values,
                use_cache=True,
            )
            next_logits = out.logits[:, -1, :].float()

        self._keep(keys, prompts, tokens, out.past_key_values, attention)
        stop_ids = set(self.stop_token_ids.tolist())
        return [
            Generation(
                token_ids=ids,
                logprobs=lps,
                finish_reason="stop" if by_string or (ids and ids[-1] in stop_ids) else "length",
            )
            for ids, lps, by_string in zip(tokens, logprobs, stopped_by_string, strict=True)
        ]

    def _prefill_inputs(
        self, prompts: list[list[int]], reused: list[tuple[int, KV | None]]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, DynamicCache]:
        """Input ids (B, S), attention mask (B, C + S), position ids (B, S) and the cache (C columns) of
        a prefill where row ``i`` reuses ``reused[i][0]`` cached positions (layout in the module doc)."""
        batch = len(prompts)
        width_cached = max(length for length, _ in reused)  # C
        suffixes = [prompt[length:] for prompt, (length, _) in zip(prompts, reused, strict=True)]
        width_new = max(len(s) for s in suffixes)  # S
        input_ids = torch.full((batch, width_new), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((batch, width_cached + width_new), dtype=torch.long)
        positions = torch.zeros((batch, width_new), dtype=torch.long)
        for row, (suffix, (length, _)) in enumerate(zip(suffixes, reused, strict=True)):
            # Right-aligned new ids keep every row's last prompt token in the last column.
            input_ids[row, width_new - len(suffix) :] = torch.tensor(suffix, dtype=torch.long)
            attention[row, width_cached - length : width_cached] = 1
            attention[row, width_cached + width_new - len(suffix) :] = 1
            positions[row, width_new - len(suffix) :] = torch.arange(length, length + len(suffix))
        cache = DynamicCache()
        if width_cached > 0:
            sample = next(layers for _, layers in reused if layers is not None)
            for index, (sample_keys, _) in enumerate(sample):
                heads, _, head_dim = sample_keys.shape
                shape = (batch, heads, width_cached, head_dim)
                keys = torch.zeros(shape, dtype=sample_keys.dtype, device=self.device)  # (B, H_kv, C, D)
                values = torch.zeros_like(keys)
                for row, (length, layers) in enumerate(reused):
                    if layers is not None:
                        keys[row, :, width_cached - length :] = layers[index][0]
                        values[row, :, width_cached - length :] = layers[index][1]
                cache.update(keys, values, index)
        return input_ids.to(self.device), attention.to(self.device), positions.to(self.device), cache

    def _keep(
        self,
        keys: list[Hashable | None],
        prompts: list[list[int]],
        tokens: list[list[int]],
        cache: DynamicCache,
        attention: torch.Tensor,
    ) -> None:
        """Store each keyed row's processed ids (prompt + reply minus its last token) and their keys/values."""
        for row, key in enumerate(keys):
            if key is None:
                continue
            columns = attention[row].nonzero().flatten()  # the row's real positions, in order
            ids = prompts[row] + tokens[row][:-1]
            assert len(columns) == len(ids), "cache columns and processed ids disagree"
            layers = [(layer.keys[row][:, columns], layer.values[row][:, columns]) for layer in cache.layers]
            self.kv_cache.store(key, CachedPrefix(ids=ids, layers=layers))

    def load_weights(self, payload: WeightsPayload) -> None:
        """Adopt ``payload``'s weights. On CPU the parameters become views of the payload's arrays in
        the object store's shared memory (no copy): a load is nearly free and every sampler and server
        on a node reads one copy of the weights. The arrays are read-only; inference never writes them."""
        tensors = unpack_state_dict(payload)
        # Views need the payload in the model's own dtype; otherwise load_state_dict copies and casts.
        same_dtype = all(t.dtype == p.dtype for t, p in zip(tensors.values(), self.model.state_dict().values()))
        self.model.load_state_dict(tensors, strict=True, assign=self.device.type == "cpu" and same_dtype)
        self.kv_cache.clear()  # cached keys/values were computed with the old weights
        self.weights_version = payload.version

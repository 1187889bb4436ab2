"""Batched sampling with a Hugging Face causal LM on CPU or one GPU.

A hand-written decode loop instead of ``model.generate``: it keeps the exact sampled ids and
their log-probabilities, stops each row on its own stop token, and draws from a seeded
``torch.Generator`` so that one config seed reproduces a run.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from actors.engines.base import Engine, Generation
from actors.models import load_model
from actors.weights import WeightsPayload, unpack_state_dict
from configs.schema import SamplingConfig


def _filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask logits outside the top-k / nucleus set with -inf. logits: (B, V)."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        # Drop a token once the mass before it already reaches top_p (the first token always stays).
        drop_sorted = (cumulative - torch.softmax(sorted_logits, dim=-1)) >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


class TransformersEngine(Engine):
    """Engine over a transformers model.

    Args:
        model_name: built-in name or local Hugging Face directory.
        dtype: ``float32`` or ``bfloat16``.
        seed: seeds the sampling generator.
        stop_token_ids: ids that end a turn (the tokenizer's end-of-turn / eos ids).
        pad_token_id: id used for left padding (never sampled into results).
    """

    def __init__(self, *, model_name: str, dtype: str, seed: int, stop_token_ids: list[int], pad_token_id: int) -> None:
        self.model = load_model(model_name, dtype)
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        self.model.to(self.device)
        self.stop_token_ids = torch.tensor(sorted(set(stop_token_ids)), device=self.device)
        self.pad_token_id = pad_token_id
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        self.weights_version = 0

    @torch.inference_mode()
    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingConfig,
        generators: list[torch.Generator] | None = None,
    ) -> list[Generation]:
        if not prompts:
            return []
        batch = len(prompts)
        width = max(len(p) for p in prompts)
        input_ids = torch.full((batch, width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((batch, width), dtype=torch.long)
        for row, prompt in enumerate(prompts):  # left padding keeps every row's last token at -1
            input_ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            attention[row, width - len(prompt) :] = 1
        input_ids, attention = input_ids.to(self.device), attention.to(self.device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)  # (B, T)

        cache = DynamicCache()
        out = self.model(
            input_ids=input_ids, attention_mask=attention, position_ids=positions, past_key_values=cache, use_cache=True
        )
        next_logits = out.logits[:, -1, :].float()  # (B, V)
        positions = positions[:, -1:]  # (B, 1)

        tokens: list[list[int]] = [[] for _ in range(batch)]
        logprobs: list[list[float]] = [[] for _ in range(batch)]
        finished = torch.zeros(batch, dtype=torch.bool, device=self.device)
        for _ in range(sampling.max_new_tokens):
            scaled = next_logits / sampling.temperature
            step_logprobs = torch.log_softmax(scaled, dim=-1)  # (B, V)
            probs = torch.softmax(_filter_logits(scaled, sampling.top_k, sampling.top_p), dim=-1)
            if generators is None:
                sampled = torch.multinomial(probs, 1, generator=self.generator).squeeze(-1)  # (B,)
            else:
                # One stream per row, drawn only while the row runs: a row's samples do not depend
                # on which other rows share the batch or how long they run.
                sampled = torch.full((batch,), self.pad_token_id, dtype=torch.long, device=self.device)
                for row in (~finished).nonzero().flatten().tolist():
                    sampled[row] = torch.multinomial(probs[row], 1, generator=generators[row])[0]
            sampled_lp = step_logprobs.gather(-1, sampled[:, None]).squeeze(-1)  # (B,)
            for row in (~finished).nonzero().flatten().tolist():
                tokens[row].append(int(sampled[row]))
                logprobs[row].append(float(sampled_lp[row]))
            finished |= torch.isin(sampled, self.stop_token_ids)
            if bool(finished.all()):
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

        stop_ids = set(self.stop_token_ids.tolist())
        return [
            Generation(
                token_ids=ids,
                logprobs=lps,
                finish_reason="stop" if ids and ids[-1] in stop_ids else "length",
            )
            for ids, lps in zip(tokens, logprobs, strict=True)
        ]

    def load_weights(self, payload: WeightsPayload) -> None:
        self.model.load_state_dict(unpack_state_dict(payload), strict=True)
        self.weights_version = payload.version

"""Attention for the transformers engine's decode steps: one new query per row against the whole cache.

Through SDPA a decode step costs far more than its arithmetic on a CPU: with a padding mask transformers repeats
each key/value head for every query head it serves (a copy of the whole cache, per layer and step), and the CPU
flash kernel is built for long queries; on SmolLM2-135M (9 query heads over 3 key/value heads), 8 rows of 1,200
positions in bfloat16, it took 62 % of a 326 ms step (2-core AMD EPYC, family 25). A decode query is one row of a
matrix product, so the step here is two batched matmuls over the cache as it is, grouped by key/value head, with
the softmax in float32. Prefills (several queries per row) go to SDPA as before.

A decode batch's cache (``batch_cache``) keeps its rows in buffers with spare columns, and the keys/values
transformers hands over are a strided window of them, which a batched matmul would copy whole first. Given that
cache (the forward's ``batch_cache`` argument), the matmuls read the live slots' buffers instead, every column,
contiguous; the columns outside the window are masked.
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from agentgym_rl.actors.engines.batch_cache import BatchLayer

DECODE_ATTENTION = "agentgym_decode"


def decode_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Attention of ``query`` (B, H, Q, D) over ``key``/``value`` (B, H_kv, W, D) under ``attention_mask`` (as
    SDPA takes it: boolean, True where attended, or additive; broadcast over heads and queries); returns
    (B, Q, H, D). One query per row (a decode step) is computed here; anything else goes to SDPA."""
    batch, heads, queries, dim = query.shape
    kv_heads = key.shape[1]
    cache = kwargs.pop("batch_cache", None)
    if queries != 1 or dropout or heads % kv_heads:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    scale = scaling if scaling is not None else dim**-0.5
    start, end = 0, key.shape[2]
    layer = None if cache is None else cache.layers[module.layer_idx]
    if isinstance(layer, BatchLayer):
        key, value, start, end = layer.slots()  # (B, H_kv, C, D) each, the window at columns start .. end
    # Query heads that share a key/value head are consecutive (the order transformers repeats them in).
    grouped = query.reshape(batch, kv_heads, heads // kv_heads, dim)  # (B, H_kv, R, D)
    scores = torch.matmul(grouped, key.transpose(-1, -2)).float() * scale  # (B, H_kv, R, C)
    window = scores[..., start:end]  # (B, H_kv, R, W), a view: masked in place
    if attention_mask is not None:
        mask = attention_mask[:, :, -1:, :]  # (B, 1, 1, W): the one query's row
        if mask.dtype == torch.bool:
            window.masked_fill_(~mask, float("-inf"))
        else:
            window.add_(mask.float())
    scores[..., :start] = float("-inf")
    scores[..., end:] = float("-inf")
    weights = torch.softmax(scores, dim=-1).to(value.dtype)
    out = torch.matmul(weights, value)  # (B, H_kv, R, D)
    return out.reshape(batch, 1, heads, dim), None


def use_decode_attention(model: torch.nn.Module) -> None:
    """Compute ``model``'s decode steps with :func:`decode_attention` (prefills with SDPA)."""
    AttentionInterface.register(DECODE_ATTENTION, decode_attention)
    AttentionMaskInterface.register(DECODE_ATTENTION, sdpa_mask)
    model.set_attn_implementation(DECODE_ATTENTION)

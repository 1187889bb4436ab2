"""Token filtering and stop-string matching shared by the engines' decode loops."""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerBase


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
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


class StopStrings:
    """Finds stop strings in a growing list of sampled ids without decoding the whole reply each step.

    A stop string of ``n`` UTF-8 bytes is spelled by at most ``n`` tokens (every token is at least one
    byte), so decoding the last ``n + 1`` ids after each step finds it the step it is completed;
    a window that starts inside a multi-byte character only garbles that character, never the match.
    Special tokens are left out of the text, as they are from the reply the environment sees.

    Args:
        tokenizer: the model's tokenizer.
        stops: the stop strings (non-empty ones).
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stops: list[str]) -> None:
        self.tokenizer = tokenizer
        self.stops = [s for s in stops if s]
        self.window = max((len(s.encode()) for s in self.stops), default=0) + 1

    def __bool__(self) -> bool:
        return bool(self.stops)

    def completed(self, sampled: list[int]) -> bool:
        """Whether the reply ``sampled`` now contains a stop string."""
        text = self.tokenizer.decode(sampled[-self.window :], skip_special_tokens=True)
        return any(stop in text for stop in self.stops)

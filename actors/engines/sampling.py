"""Per-row sampling settings, token filtering and stop-string matching shared by the engines' decode loops."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from transformers import PreTrainedTokenizerBase

from agentgym_rl.configs.schema import SamplingConfig

# OpenAI's bound on `top_logprobs`; a row asks for at most this many alternatives per token.
MAX_TOP_LOGPROBS = 20
# A temperature or top_p below this samples greedily (vLLM's threshold too). Dividing logits by a smaller
# temperature overflows float32 to inf (1e-300 and 5e-324 are 0 in float32), and a smaller top_p rounds to 0
# in float32, so both would give the row non-finite probabilities; at this floor one token holds all but a
# vanishing share of the mass anyway.
GREEDY_BELOW = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    """How one row (one completion) is sampled; rows of one batch may differ in every field.

    A ``temperature`` or ``top_p`` below :data:`GREEDY_BELOW` (temperature 0 included) is greedy decoding and
    is stored as such, ``temperature=1, top_p=1, top_k=1``, so every engine reads the same settings and none
    divides by a vanishing temperature (the reported log-probabilities are then temperature 1's).

    Attributes:
        temperature: divides the logits before sampling (>= 0; below ``GREEDY_BELOW``: greedy).
        top_p: nucleus mass kept (0 < top_p <= 1; below ``GREEDY_BELOW``: greedy).
        top_k: keep only the k likeliest tokens; 0 disables.
        max_new_tokens: cap on the row's sampled tokens.
        stop: strings that end the row once its reply contains one (the completing token is kept).
        presence_penalty: subtracted once from the logit of every token already in the reply.
        frequency_penalty: subtracted from a token's logit once per occurrence in the reply (both
            penalties apply before the temperature, as in OpenAI's API and vLLM).
        top_logprobs: alternatives per sampled token whose log-probabilities are reported (0: none).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 64
    stop: tuple[str, ...] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    top_logprobs: int = 0

    def __post_init__(self) -> None:
        problems = [
            f"{name}={value!r} ({rule})"
            for name, value, ok, rule in (
                ("temperature", self.temperature, self.temperature >= 0, "must be >= 0"),
                ("top_p", self.top_p, 0 < self.top_p <= 1, "must be in (0, 1]"),
                ("top_k", self.top_k, self.top_k >= 0, "must be >= 0"),
                ("max_new_tokens", self.max_new_tokens, self.max_new_tokens >= 1, "must be >= 1"),
                ("top_logprobs", self.top_logprobs, 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS, "must be 0-20"),
                ("stop", self.stop, all(self.stop), "strings must be non-empty"),
                ("presence_penalty", self.presence_penalty, math.isfinite(self.presence_penalty), "must be finite"),
                ("frequency_penalty", self.frequency_penalty, math.isfinite(self.frequency_penalty), "must be finite"),
            )
            if not ok
        ]
        if problems:
            raise ValueError(f"invalid sampling settings: {'; '.join(problems)}")
        if self.temperature < GREEDY_BELOW or self.top_p < GREEDY_BELOW:
            # The one place a vanishing setting becomes greedy (frozen: set through object's own setter).
            for name, value in (("temperature", 1.0), ("top_p", 1.0), ("top_k", 1)):
                object.__setattr__(self, name, value)

    @classmethod
    def from_config(cls, config: SamplingConfig) -> SamplingParams:
        """The settings a sampler applies to every row of its batches."""
        return cls(
            temperature=config.temperature,
            top_p=config.top_p,
            top_k=config.top_k,
            max_new_tokens=config.max_new_tokens,
            stop=tuple(config.stop),
        )

    @property
    def penalised(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def distribution(self) -> tuple[float, int, float]:
        """The settings that shape the distribution a token is drawn from: (temperature, top_k, top_p)."""
        return (self.temperature, self.top_k, self.top_p)


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask logits outside the top-k / nucleus set with -inf. logits: (B, V)."""
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        # Drop a token once the mass before it already reaches top_p; the likeliest always stays, even where
        # top_p rounds to 0 in the logits' dtype.
        drop_sorted = (cumulative - torch.softmax(sorted_logits, dim=-1)) >= top_p
        drop_sorted[:, 0] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def stream_on(generator: torch.Generator, device: torch.device) -> torch.Generator:
    """``generator`` itself when it lives on ``device``'s kind of device, else a stream there seeded by one draw
    from it.

    A row's draws then stay on the device its probabilities are on (no (V,) host copy per token), and
    still depend only on the caller's stream: the same seed gives the same tokens whatever shares the batch.
    """
    if generator.device.type == device.type:
        return generator
    seed = int(torch.randint(2**63 - 1, (), generator=generator, device=generator.device))
    return torch.Generator(device=device).manual_seed(seed)


def sample_rows(probs: torch.Tensor, draws: list[tuple[torch.Generator, list[int]]]) -> torch.Tensor:
    """One token id per row of ``probs`` (B, V), drawn on its device; returns (B,) on that device.

    ``torch.multinomial(p, 1)`` is PyTorch's Gumbel-max draw ``argmax(p / q)`` with ``q ~ Exp(1)``; drawing
    ``q`` here gives the same ids as ``torch.multinomial(probs[rows], 1, generator=stream)`` for each
    ``(stream, rows)`` of ``draws`` (each stream fills its rows' noise at once, in order, as multinomial
    does), without multinomial's host sync per call, and all rows share one division and argmax.
    Every stream must live on ``probs``' device. Rows no stream draws for get an id the caller ignores.
    """
    noise = torch.ones_like(probs)  # (B, V)
    for stream, rows in draws:
        if len(rows) == probs.shape[0]:
            noise.exponential_(generator=stream)
        elif len(rows) == 1:
            noise[rows[0]].exponential_(generator=stream)
        elif rows:
            block = torch.empty((len(rows), probs.shape[1]), dtype=probs.dtype, device=probs.device)
            noise[torch.tensor(rows, device=probs.device)] = block.exponential_(generator=stream)
    return torch.div(probs, noise, out=noise).argmax(dim=-1)  # (B,): multinomial divides in place too


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

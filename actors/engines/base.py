"""The generation-engine interface shared by samplers and (later) the serving deployment."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Literal

import torch

from actors.weights import WeightsPayload
from configs.schema import SamplingConfig


@dataclass(frozen=True)
class Generation:
    """One completion: the sampled ids exactly as sampled, and their log-probabilities.

    ``logprobs[i]`` is log p(token_ids[i]) under the temperature-scaled distribution the token was
    drawn from (before top-k/top-p truncation). ``finish_reason`` is ``stop`` when a stop token was
    sampled (it is included in ``token_ids``) and ``length`` when the per-turn cap was hit.
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]


class Engine(abc.ABC):
    """Generates continuations of token-id prompts; holds one versioned copy of the policy weights."""

    weights_version: int = 0

    @abc.abstractmethod
    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingConfig,
        generators: list[torch.Generator] | None = None,
    ) -> list[Generation]:
        """Sample one continuation per prompt, in order.

        ``generators`` (one per prompt) give each row its own random stream, so that an episode's
        samples depend on its seed and not on which other episodes share the batch; without them
        the engine's own seeded stream is used.
        """

    @abc.abstractmethod
    def load_weights(self, payload: WeightsPayload) -> None:
        """Replace the policy weights with ``payload`` and adopt its version."""

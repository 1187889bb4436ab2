"""SFT: behaviour cloning on the sampled (or oracle / logged) tokens of trajectories."""

from __future__ import annotations

import torch
from typing_extensions import override

from agentgym_rl.learner.algorithms.base import LOGPROBS, LOSS_MASK, Algorithm, register_algorithm
from agentgym_rl.learner.losses import aggregate


@register_algorithm
class SFT(Algorithm):
    """Negative log-likelihood of the reply tokens; environment tokens are context only. With the
    oracle sampler (``sampler.policy: oracle``) this is the warm start small models need."""

    name = "sft"

    @property
    @override
    def uses_old_logprobs(self) -> bool:
        return False

    @property
    @override
    def differentiates_entropy(self) -> bool:
        return False

    @override
    def compute_advantages(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.zeros_like(batch[LOSS_MASK])

    @override
    def compute_loss(
        self, batch: dict[str, torch.Tensor], forward_out: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        nll = aggregate(-forward_out[LOGPROBS], batch[LOSS_MASK], self.config.aggregation)
        return nll, {"learner/nll": float(nll.detach())}

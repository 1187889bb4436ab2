"""GRPO: group-relative outcome advantages with a clipped surrogate and a KL loss term."""

from __future__ import annotations

import torch
from typing_extensions import override

from learner.algorithms.base import (
    ADVANTAGES,
    ENTROPY,
    GROUPS,
    LOGPROBS,
    LOSS_MASK,
    OLD_LOGPROBS,
    REF_LOGPROBS,
    REWARDS,
    Algorithm,
    register_algorithm,
)
from learner.losses import clipped_policy_loss, group_normalized_advantages, low_variance_kl, masked_mean


@register_algorithm
class GRPO(Algorithm):
    """Group Relative Policy Optimization (Shao et al. 2024), as AgentGym-RL trains with it.

    Every sampled token of a trajectory gets the trajectory's group-normalised outcome advantage;
    the loss is the clipped surrogate plus ``kl_coef`` times the k3 KL to the reference model,
    minus ``entropy_coef`` times the entropy, averaged over sampled tokens.
    """

    name = "grpo"

    @override
    def compute_advantages(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        per_episode = group_normalized_advantages(batch[REWARDS], batch[GROUPS], self.config.adv_eps)  # (B,)
        return per_episode[:, None] * batch[LOSS_MASK]  # (B, T)

    @override
    def compute_loss(
        self, batch: dict[str, torch.Tensor], forward_out: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        mask = batch[LOSS_MASK]
        logprobs = forward_out[LOGPROBS]
        pg, clipped = clipped_policy_loss(logprobs, batch[OLD_LOGPROBS], batch[ADVANTAGES], self.config.clip_eps)
        per_token = pg
        metrics: dict[str, float] = {}
        if self.needs_reference:
            kl = low_variance_kl(logprobs, batch[REF_LOGPROBS])
            per_token = per_token + self.config.kl_coef * kl
            metrics["learner/kl"] = float(masked_mean(kl.detach(), mask))
        if self.config.entropy_coef > 0:
            per_token = per_token - self.config.entropy_coef * forward_out[ENTROPY]
        loss = masked_mean(per_token, mask)
        metrics["learner/pg_loss"] = float(masked_mean(pg.detach(), mask))
        metrics["learner/pg_clipfrac"] = float(masked_mean(clipped, mask))
        metrics["learner/entropy"] = float(masked_mean(forward_out[ENTROPY].detach(), mask))
        return loss, metrics

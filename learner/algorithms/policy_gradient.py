"""Shared machinery of the policy-gradient algorithms (GRPO, RLOO, REINFORCE++, PPO).

Subclasses implement one hook, ``estimate_advantages``; this base applies the configured treatment
of truncated episodes and the KL-as-reward penalty first, and its loss is the clipped surrogate
plus the KL loss term and the entropy bonus.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Literal

import torch
from pydantic import Field, model_validator
from typing_extensions import override

from learner.advantages import uniform_groups
from learner.algorithms.base import (
    ADVANTAGES,
    ENTROPY,
    LOGPROBS,
    LOSS_MASK,
    OLD_LOGPROBS,
    REF_LOGPROBS,
    REWARDS,
    TOKEN_REWARDS,
    TRUNCATED,
    Algorithm,
    AlgorithmParams,
)
from learner.losses import aggregate, clipped_policy_loss, kl_penalty, masked_mean

if TYPE_CHECKING:
    from actors.trajectory import Trajectory


class PolicyGradientParams(AlgorithmParams):
    clip_eps: float = Field(0.2, gt=0.0, description="Ratio clip epsilon of the surrogate objective.")
    dual_clip: float | None = Field(None, gt=1.0, description="Dual-clip constant c > 1 for negative advantages.")
    kl_coef: float = Field(0.001, ge=0.0, description="KL-to-reference weight; 0 drops the reference model.")
    kl_estimator: Literal["k1", "k2", "k3"] = Field("k3", description="KL estimator (k3: low variance).")
    kl_mode: Literal["loss", "reward"] = Field(
        "loss", description="Apply KL as a loss term, or subtract it from the rewards before advantages."
    )
    entropy_coef: float = Field(0.0, ge=0.0, description="Entropy bonus weight.")
    truncated: Literal["keep", "zero_reward", "drop"] = Field(
        "keep",
        description="Episodes cut by the horizon or context: keep their reward, set it to 0, or leave them "
        "out of the loss.",
    )


class PolicyGradient(Algorithm):
    """Base of the shipped policy-gradient algorithms."""

    Config = PolicyGradientParams
    config: PolicyGradientParams

    @property
    @override
    def needs_reference(self) -> bool:
        return self.config.kl_coef > 0

    @property
    @override
    def advantages_read_old_logprobs(self) -> bool:
        # Only the KL-as-reward penalty, subtracted from the rewards before the advantages, reads them.
        return self.config.kl_mode == "reward" and self.needs_reference

    @abc.abstractmethod
    def estimate_advantages(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Per-token advantages (B, T) from the shaped rewards in ``batch``."""

    @override
    def compute_advantages(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        truncated = batch[TRUNCATED].bool()
        if self.config.truncated == "zero_reward":
            batch[REWARDS] = torch.where(truncated, 0.0, batch[REWARDS])
            batch[TOKEN_REWARDS] = batch[TOKEN_REWARDS] * (~truncated)[:, None]
        elif self.config.truncated == "drop":
            batch[LOSS_MASK] = batch[LOSS_MASK] * (~truncated)[:, None]
        if self.config.kl_mode == "reward" and self.needs_reference:
            penalty = (
                self.config.kl_coef
                * kl_penalty(batch[OLD_LOGPROBS], batch[REF_LOGPROBS], self.config.kl_estimator)
                * batch[LOSS_MASK]
            )
            batch[TOKEN_REWARDS] = batch[TOKEN_REWARDS] - penalty
            batch[REWARDS] = batch[REWARDS] - penalty.sum(-1)
        return self.estimate_advantages(batch) * batch[LOSS_MASK]

    def policy_loss(
        self, batch: dict[str, torch.Tensor], forward_out: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Clipped surrogate + KL loss term - entropy bonus, reduced with ``config.aggregation``."""
        mask = batch[LOSS_MASK]
        logprobs = forward_out[LOGPROBS]
        pg, clipped = clipped_policy_loss(
            logprobs, batch[OLD_LOGPROBS], batch[ADVANTAGES], self.config.clip_eps, self.config.dual_clip
        )
        per_token = pg
        metrics: dict[str, float] = {}
        if self.config.kl_mode == "loss" and self.needs_reference:
            kl = kl_penalty(logprobs, batch[REF_LOGPROBS], self.config.kl_estimator)
            per_token = per_token + self.config.kl_coef * kl
            metrics["learner/kl"] = float(masked_mean(kl.detach(), mask))
        if self.config.entropy_coef > 0:
            per_token = per_token - self.config.entropy_coef * forward_out[ENTROPY]
        metrics["learner/pg_loss"] = float(aggregate(pg.detach(), mask, self.config.aggregation))
        metrics["learner/pg_clipfrac"] = float(masked_mean(clipped, mask))
        metrics["learner/entropy"] = float(masked_mean(forward_out[ENTROPY].detach(), mask))
        return aggregate(per_token, mask, self.config.aggregation), metrics

    @override
    def compute_loss(
        self, batch: dict[str, torch.Tensor], forward_out: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        return self.policy_loss(batch, forward_out)


class GroupRelativeParams(PolicyGradientParams):
    skip_uniform_groups: bool = Field(
        True,
        description="Leave groups whose episodes all got the same reward out of the update (no forward or "
        "backward): their advantages are all 0, so only the KL and entropy terms would act (DAPO's dynamic-"
        "sampling filter). Not applied with the KL-as-reward penalty (kl_mode=reward), which makes rewards differ.",
    )

    @model_validator(mode="after")
    def _skip_fits_kl_mode(self) -> GroupRelativeParams:
        if "skip_uniform_groups" in self.model_fields_set and self.skip_uniform_groups and self.kl_shapes_rewards:
            raise ValueError(
                "skip_uniform_groups=true cannot apply with kl_mode=reward and kl_coef > 0 (the KL penalty makes "
                "every group's rewards differ); set skip_uniform_groups=false or kl_mode=loss"
            )
        return self

    @property
    def kl_shapes_rewards(self) -> bool:
        return self.kl_mode == "reward" and self.kl_coef > 0


class GroupRelative(PolicyGradient):
    """Base of the algorithms whose advantages compare the episodes of a task's group (GRPO, RLOO)."""

    Config = GroupRelativeParams
    config: GroupRelativeParams

    @property
    @override
    def skips_uninformative_groups(self) -> bool:
        return self.config.skip_uniform_groups and not self.config.kl_shapes_rewards

    @override
    def select_trajectories(self, trajectories: list[Trajectory]) -> list[Trajectory]:
        """Every trajectory, less the groups whose rewards (as the advantages see them) are all equal when
        ``skip_uniform_groups`` applies."""
        if not trajectories or not self.skips_uninformative_groups:
            return trajectories
        zero_truncated = self.config.truncated == "zero_reward"
        rewards = torch.tensor([0.0 if zero_truncated and t.truncated else t.reward for t in trajectories])
        uniform = uniform_groups(rewards, torch.tensor([t.group for t in trajectories]))
        return [t for t, skip in zip(trajectories, uniform.tolist(), strict=True) if not skip]

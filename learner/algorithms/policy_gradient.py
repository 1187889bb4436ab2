"""Shared machinery of the policy-gradient algorithms (GRPO, RLOO, REINFORCE++, PPO, GiGPO, GSPO, CISPO).

Subclasses implement one hook, ``estimate_advantages``; this base applies the configured treatment
of truncated episodes, the overlong penalty and the KL-as-reward penalty first, and its loss is the
chosen surrogate (PPO's clip, GSPO's sequence clip or CISPO's clipped weight), optionally weighted
against the sampler/learner mismatch, plus the KL loss term and the entropy bonus.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Literal, Protocol

import torch
from pydantic import BaseModel, Field, field_validator, model_validator
from typing_extensions import override

from agentgym_rl.configs.targets import import_target
from agentgym_rl.learner.advantages import discounted_turn_returns, turn_rewards, uniform_groups
from agentgym_rl.learner.algorithms.base import (
    ADVANTAGES,
    ENTROPY,
    LOGPROBS,
    LOSS_MASK,
    OLD_LOGPROBS,
    REF_LOGPROBS,
    REWARDS,
    SAMPLER_LOGPROBS,
    TOKEN_REWARDS,
    TRUNCATED,
    TURN_CAPPED,
    TURN_IDS,
    Algorithm,
    AlgorithmConfigError,
    AlgorithmParams,
)
from agentgym_rl.learner.losses import (
    aggregate,
    cispo_policy_loss,
    clipped_policy_loss,
    gspo_policy_loss,
    kl_penalty,
    masked_mean,
    rollout_correction_weights,
)

if TYPE_CHECKING:
    from agentgym_rl.actors.trajectory import Trajectory


class PolicyLoss(Protocol):
    """A surrogate loss (``algorithm.policy_loss``): the one signature of the policy-loss registry."""

    def __call__(
        self,
        *,
        logprobs: torch.Tensor,
        old_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        config: PolicyGradientParams,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The per-token loss of a micro-batch; the learner reduces it with ``config.aggregation``.

        Args:
            logprobs: (B, T) current policy log-probabilities (with grad).
            old_logprobs: (B, T) log-probabilities of the policy that sampled the data (the ratio's denominator).
            advantages: (B, T) per-token advantages.
            mask: (B, T) 1 on sampled tokens.
            config: the algorithm's hyperparameters (``clip_range``, ``dual_clip``, a subclass's own keys).

        Returns:
            ((B, T) loss to minimise; (B, T) float mask of tokens where a clip was active, reported as
            ``learner/pg_clipfrac``).
        """


_POLICY_LOSSES: dict[str, PolicyLoss] = {}


def register_policy_loss(name: str) -> Callable[[PolicyLoss], PolicyLoss]:
    """Decorator: make a :class:`PolicyLoss` selectable as ``algorithm.policy_loss: <name>`` by every
    policy-gradient algorithm (verl's ``register_policy_loss``), in the process that runs this."""

    def register(loss: PolicyLoss) -> PolicyLoss:
        _POLICY_LOSSES[name] = loss
        return loss

    return register


def policy_loss_names() -> list[str]:
    """Registered policy-loss names, sorted."""
    return sorted(_POLICY_LOSSES)


def resolve_policy_loss(name: str) -> PolicyLoss:
    """The loss registered as ``name``, or the function a ``package.module:function`` path names (a process such
    as a learner actor then finds a loss registered elsewhere).

    Raises:
        AlgorithmConfigError: unknown name (listing the registered ones), unimportable path, or not callable.
    """
    if ":" not in name:
        if name not in _POLICY_LOSSES:
            raise AlgorithmConfigError(
                f"unknown policy loss {name!r}; registered: {', '.join(policy_loss_names())} "
                "(or give package.module:function)"
            )
        return _POLICY_LOSSES[name]
    try:
        loss = import_target(name)
    except ImportError as exc:
        raise AlgorithmConfigError(f"policy loss {name!r} cannot be imported: {exc}") from exc
    if not callable(loss):
        raise AlgorithmConfigError(f"policy loss {name!r} is not a function")
    return loss


@register_policy_loss("ppo")
def ppo_loss(
    *,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: PolicyGradientParams,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's per-token clipped ratio, with the dual clip when set (:func:`learner.losses.clipped_policy_loss`)."""
    low, high = config.clip_range
    return clipped_policy_loss(logprobs, old_logprobs, advantages, low, high, config.dual_clip)


@register_policy_loss("gspo")
def gspo_loss(
    *,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: PolicyGradientParams,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GSPO's clipped sequence ratio (:func:`learner.losses.gspo_policy_loss`)."""
    low, high = config.clip_range
    return gspo_policy_loss(logprobs, old_logprobs, advantages, mask, low, high)


@register_policy_loss("cispo")
def cispo_loss(
    *,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: PolicyGradientParams,
) -> tuple[torch.Tensor, torch.Tensor]:
    """CISPO's clipped, detached importance weight (:func:`learner.losses.cispo_policy_loss`)."""
    low, high = config.clip_range
    return cispo_policy_loss(logprobs, old_logprobs, advantages, low, high)


class PolicyGradientParams(AlgorithmParams):
    clip_eps: float = Field(
        0.2, gt=0.0, description="Ratio clip epsilon of the surrogate objective (both sides unless clip_low/high)."
    )
    clip_low: float | None = Field(
        None,
        gt=0.0,
        le=1.0,
        description="Clip range below 1 (the ratio's lower bound is 1 - clip_low); None: clip_eps.",
    )
    clip_high: float | None = Field(
        None,
        gt=0.0,
        description="Clip range above 1 (upper bound 1 + clip_high); None: clip_eps. DAPO's clip-higher "
        "(arXiv 2503.14476) sets it above clip_low, e.g. 0.28 with 0.2.",
    )
    dual_clip: float | None = Field(
        None, gt=1.0, description="Dual-clip constant c > 1 for negative advantages (policy_loss=ppo only)."
    )
    policy_loss: str = Field(
        "ppo",
        description="Surrogate: `ppo` (per-token ratio, clipped), `gspo` (one length-normalised ratio per "
        "episode, clipped; arXiv 2507.18071), `cispo` (REINFORCE weighted by the clipped, detached ratio; "
        "arXiv 2506.13585), a loss registered with `learner.register_policy_loss`, or its "
        "`package.module:function`. The clip range is clip_low/clip_high either way.",
    )
    rollout_correction: Literal["none", "tis", "mis"] = Field(
        "none",
        description="Importance weight of each token against the sampler's log-prob (the learner's old over the "
        "sampler's probability): `tis` truncates it at rollout_correction_cap, `mis` drops tokens above the cap; "
        "`none` trusts the sampler. Needs learner.old_logprobs auto or recompute.",
    )
    rollout_correction_cap: float = Field(
        2.0, gt=1.0, description="The cap C of the rollout correction's ratio (Yao et al. 2025 use 2)."
    )
    overlong_penalty: float = Field(
        0.0,
        ge=0.0,
        description="Subtracted from the reward of every turn whose reply was cut by sampler.sampling."
        "max_new_tokens (DAPO's overlong shaping, per turn); 0: off.",
    )
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

    @field_validator("policy_loss")
    @classmethod
    def _registered_policy_loss(cls, name: str) -> str:
        resolve_policy_loss(name)
        return name

    @model_validator(mode="after")
    def _dual_clip_fits_the_loss(self) -> PolicyGradientParams:
        if self.dual_clip is not None and self.policy_loss != "ppo":
            raise ValueError(
                f"dual_clip applies to policy_loss=ppo only (got policy_loss={self.policy_loss}); unset dual_clip"
            )
        return self

    @property
    def clip_range(self) -> tuple[float, float]:
        """(clip_low, clip_high) with clip_eps standing in for an unset side."""
        low = self.clip_eps if self.clip_low is None else self.clip_low
        high = self.clip_eps if self.clip_high is None else self.clip_high
        return low, high


class TurnCreditParams(BaseModel):
    """``credit`` and ``turn_gamma``: mixed into the configs of GRPO, RLOO and REINFORCE++."""

    credit: Literal["outcome", "turn"] = Field(
        "outcome",
        description="`outcome`: the algorithm's own credit from the episode's rewards; `turn`: every token of "
        "turn k gets the turn-level return G_k = r_k + turn_gamma * G_{k+1} from the per-turn rewards.",
    )
    turn_gamma: float = Field(1.0, ge=0.0, le=1.0, description="Discount per turn of credit=turn.")

    @model_validator(mode="after")
    def _turn_gamma_needs_turn_credit(self) -> TurnCreditParams:
        if self.turn_gamma != 1.0 and self.credit != "turn":
            raise ValueError("turn_gamma discounts turn-level returns; set credit=turn or unset turn_gamma")
        return self


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
    def differentiates_entropy(self) -> bool:
        return self.config.entropy_coef > 0

    @property
    @override
    def advantages_read_old_logprobs(self) -> bool:
        # Only the KL-as-reward penalty, subtracted from the rewards before the advantages, reads them.
        return self.config.kl_mode == "reward" and self.needs_reference

    @property
    @override
    def corrects_rollout_mismatch(self) -> bool:
        return self.config.rollout_correction != "none"

    @abc.abstractmethod
    def estimate_advantages(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Per-token advantages (B, T) from the shaped rewards in ``batch``."""

    def turn_returns(self, batch: dict[str, torch.Tensor], gamma: float) -> torch.Tensor:
        """(B, K) discounted turn-level returns of the shaped per-turn rewards in ``batch``."""
        return discounted_turn_returns(turn_rewards(batch[TOKEN_REWARDS], batch[TURN_IDS]), gamma)

    def shaped_turn_rewards(self, trajectory: Trajectory) -> list[float]:
        """Each turn's reward of ``trajectory`` as ``compute_advantages`` shapes it (``truncated=zero_reward``
        and ``overlong_penalty``; the KL-as-reward penalty, which needs the model, left out)."""
        zero = self.config.truncated == "zero_reward" and trajectory.truncated
        capped = trajectory.turn_capped + [False] * (len(trajectory.step_rewards) - len(trajectory.turn_capped))
        penalty = self.config.overlong_penalty
        return [
            (0.0 if zero else reward) - (penalty if cut else 0.0)
            for reward, cut in zip(trajectory.step_rewards, capped)
        ]

    @override
    def compute_advantages(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        truncated = batch[TRUNCATED].bool()
        if self.config.truncated == "zero_reward":
            batch[REWARDS] = torch.where(truncated, 0.0, batch[REWARDS])
            batch[TOKEN_REWARDS] = batch[TOKEN_REWARDS] * (~truncated)[:, None]
        elif self.config.truncated == "drop":
            batch[LOSS_MASK] = batch[LOSS_MASK] * (~truncated)[:, None]
        if self.config.overlong_penalty > 0:
            # On the last token of each cut reply, where that turn's reward sits.
            overlong = self.config.overlong_penalty * batch[TURN_CAPPED]
            batch[TOKEN_REWARDS] = batch[TOKEN_REWARDS] - overlong
            batch[REWARDS] = batch[REWARDS] - overlong.sum(-1)
        if self.config.kl_mode == "reward" and self.needs_reference:
            penalty = (
                self.config.kl_coef
                * kl_penalty(batch[OLD_LOGPROBS], batch[REF_LOGPROBS], self.config.kl_estimator)
                * batch[LOSS_MASK]
            )
            batch[TOKEN_REWARDS] = batch[TOKEN_REWARDS] - penalty
            batch[REWARDS] = batch[REWARDS] - penalty.sum(-1)
        return self.estimate_advantages(batch) * batch[LOSS_MASK]

    def surrogate(self, batch: dict[str, torch.Tensor], logprobs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The configured surrogate's per-token loss and clip mask, both (B, T)."""
        loss = resolve_policy_loss(self.config.policy_loss)
        return loss(
            logprobs=logprobs,
            old_logprobs=batch[OLD_LOGPROBS],
            advantages=batch[ADVANTAGES],
            mask=batch[LOSS_MASK],
            config=self.config,
        )

    def policy_loss(
        self, batch: dict[str, torch.Tensor], forward_out: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Surrogate (rollout-corrected) + KL loss term - entropy bonus, reduced with ``config.aggregation``."""
        mask = batch[LOSS_MASK]
        logprobs = forward_out[LOGPROBS]
        pg, clipped = self.surrogate(batch, logprobs)
        metrics: dict[str, float] = {}
        if self.config.rollout_correction != "none":
            weights, capped = rollout_correction_weights(
                batch[OLD_LOGPROBS],
                batch[SAMPLER_LOGPROBS],
                self.config.rollout_correction,
                self.config.rollout_correction_cap,
            )
            pg = pg * weights
            ratio = torch.exp(batch[OLD_LOGPROBS] - batch[SAMPLER_LOGPROBS])
            metrics["learner/rollout_is_ratio_mean"] = float(masked_mean(ratio, mask))
            metrics["learner/rollout_is_weight_mean"] = float(masked_mean(weights, mask))
            metrics["learner/rollout_is_capped_frac"] = float(masked_mean(capped, mask))
        per_token = pg
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


def turn_level_returns(rewards: list[float], gamma: float) -> list[float]:
    """G_k = r_k + gamma * G_{k+1} of one episode's per-turn ``rewards`` (the list form of
    :func:`learner.advantages.discounted_turn_returns`, for choosing trajectories before collating)."""
    returns, running = [], 0.0
    for reward in reversed(rewards):
        running = reward + gamma * running
        returns.append(running)
    return returns[::-1]


class GroupRelativeParams(PolicyGradientParams):
    skip_uniform_groups: bool = Field(
        True,
        description="Leave groups whose episodes all got the same reward (for turn-level credit: whose turns "
        "all got the same return) out of the update (no forward or backward): their advantages are all 0, so "
        "only the KL and entropy terms would act (DAPO's dynamic-sampling filter). Not applied with the "
        "KL-as-reward penalty (kl_mode=reward), which makes rewards differ.",
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
    """Base of the algorithms whose advantages compare the episodes of a task's group (GRPO, RLOO, GiGPO)."""

    Config = GroupRelativeParams
    config: GroupRelativeParams

    @property
    @override
    def skips_uninformative_groups(self) -> bool:
        return self.config.skip_uniform_groups and not self.config.kl_shapes_rewards

    def compared_values(self, trajectory: Trajectory) -> dict[Hashable, list[float]]:
        """What the advantages compare across a group, by what each value is compared with: here the episode's
        shaped reward, or its turn-level returns with ``credit=turn`` (all of a group's turns compared together).
        A group carries no signal when, under every key, the values its episodes give are all equal."""
        rewards = self.shaped_turn_rewards(trajectory)
        if isinstance(self.config, TurnCreditParams) and self.config.credit == "turn":
            return {"turns": turn_level_returns(rewards, self.config.turn_gamma)}
        zero = self.config.truncated == "zero_reward" and trajectory.truncated
        # The recorded outcome, less the overlong penalties (a sum of step rewards could round differently).
        overlong = self.config.overlong_penalty * sum(trajectory.turn_capped)
        return {"episode": [(0.0 if zero else trajectory.reward) - overlong]}

    @override
    def select_trajectories(self, trajectories: list[Trajectory]) -> list[Trajectory]:
        """Every trajectory, less the groups that carry no signal (:meth:`compared_values`) when
        ``skip_uniform_groups`` applies."""
        if not trajectories or not self.skips_uninformative_groups:
            return trajectories
        pairs: list[tuple[int, Hashable]] = []  # (group, key) of each compared value
        values: list[float] = []
        for trajectory in trajectories:
            for key, compared in self.compared_values(trajectory).items():
                pairs += [(trajectory.group, key)] * len(compared)
                values += compared
        if not values:
            return []
        ids = {pair: i for i, pair in enumerate(dict.fromkeys(pairs))}
        uniform = uniform_groups(torch.tensor(values), torch.tensor([ids[pair] for pair in pairs]))
        informative = {group for (group, _), flat in zip(pairs, uniform.tolist(), strict=True) if not flat}
        return [t for t in trajectories if t.group in informative]

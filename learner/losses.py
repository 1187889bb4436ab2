"""Pure tensor functions for policy-gradient losses. No Ray, no I/O.

Shapes: ``B`` trajectories, ``T`` target positions (one per token after the first).
"""

from __future__ import annotations

from typing import Literal

import torch

KLEstimator = Literal["k1", "k2", "k3"]
Aggregation = Literal["token_mean", "seq_mean"]
RolloutCorrection = Literal["none", "tis", "mis"]


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` where ``mask`` is 1; 0 when the mask is empty. values, mask: (B, T)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def aggregate(values: torch.Tensor, mask: torch.Tensor, mode: Aggregation) -> torch.Tensor:
    """Reduce per-token ``values`` (B, T) to a scalar.

    ``token_mean`` weighs every sampled token equally (long episodes weigh more); ``seq_mean``
    averages within each episode first, then over episodes with at least one sampled token.
    """
    if mode == "token_mean":
        return masked_mean(values, mask)
    m = mask.to(values.dtype)
    per_seq = (values * m).sum(-1) / m.sum(-1).clamp(min=1.0)  # (B,)
    has_tokens = (m.sum(-1) > 0).to(values.dtype)
    return (per_seq * has_tokens).sum() / has_tokens.sum().clamp(min=1.0)


def clipped_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate per token (Schulman et al. 2017), as a loss to minimise.

    The ratio is clipped to [1 - clip_low, 1 + clip_high]; equal bounds are PPO's, a larger
    ``clip_high`` is DAPO's clip-higher (Yu et al. 2025, arXiv 2503.14476), which leaves more room to
    raise unlikely tokens. With ``dual_clip = c > 1`` the loss of a negative-advantage token is also
    capped at -c * A (Ye et al. 2020), so a huge ratio on a bad token cannot dominate the update.

    Args:
        logprobs: (B, T) current policy log-probabilities (with grad).
        old_logprobs: (B, T) log-probabilities of the policy that sampled the data.
        advantages: (B, T) per-token advantages.
        clip_low, clip_high: the ratio's clip range below and above 1.
        dual_clip: optional dual-clip constant c > 1.

    Returns:
        ((B, T) loss, (B, T) float mask of tokens where a clip was active).
    """
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = -ratio * advantages
    clipped = -torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    loss = torch.maximum(unclipped, clipped)
    active = clipped > unclipped
    if dual_clip is not None:
        cap = -dual_clip * advantages
        dual = (advantages < 0) & (loss > cap)
        loss = torch.where(dual, cap, loss)
        active = active | dual
    return loss, active.float()


def sequence_ratios(logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO's sequence importance ratio s = exp(mean over sampled tokens of (logp - old_logp)), the
    length-normalised (geometric-mean) likelihood ratio of the whole episode; 1 for a row without sampled
    tokens. (B, T) -> (B,)"""
    m = mask.to(logprobs.dtype)
    mean_log_ratio = ((logprobs - old_logprobs) * m).sum(-1) / m.sum(-1).clamp(min=1.0)
    return torch.exp(mean_log_ratio)


def gspo_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GSPO's clipped surrogate (Zheng et al. 2025, arXiv 2507.18071) in its GSPO-token form, per token.

    Every sampled token of a row uses the row's sequence ratio s (:func:`sequence_ratios`) as its ratio,
    s_t = sg(s) * pi(y_t) / sg(pi(y_t)): equal to s in value, with the gradient of s * log pi(y_t). The
    clip to [1 - clip_low, 1 + clip_high] acts on s, so a whole episode is clipped or not; with one
    advantage per episode and ``seq_mean`` aggregation this is GSPO's sequence-level objective exactly.
    The paper's clip range is tiny (3e-4 below, 4e-4 above) because s averages over the episode.

    Args:
        logprobs: (B, T) current policy log-probabilities (with grad).
        old_logprobs: (B, T) log-probabilities of the policy that sampled the data.
        advantages: (B, T) per-token advantages.
        mask: (B, T) 1 on sampled tokens.
        clip_low, clip_high: the sequence ratio's clip range below and above 1.

    Returns:
        ((B, T) loss, (B, T) float mask of tokens where the clip was active).
    """
    seq_ratio = sequence_ratios(logprobs, old_logprobs, mask)  # (B,)
    ratio = seq_ratio.detach()[:, None] * torch.exp(logprobs - logprobs.detach())  # (B, T), value s per row
    unclipped = -ratio * advantages
    clipped = -torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    return torch.maximum(unclipped, clipped), (clipped > unclipped).float()


def cispo_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """CISPO (MiniMax-M1, arXiv 2506.13585): REINFORCE weighted by the clipped importance weight.

    loss_t = -sg(clip(r_t, 1 - clip_low, 1 + clip_high)) * A_t * log pi(y_t): the weight is clipped and
    detached, so a token whose ratio left the range still gets a gradient (PPO's clip would drop it).
    At r = 1 the gradient equals PPO's.

    Args:
        logprobs: (B, T) current policy log-probabilities (with grad).
        old_logprobs: (B, T) log-probabilities of the policy that sampled the data.
        advantages: (B, T) per-token advantages.
        clip_low, clip_high: the weight's clip range below and above 1 (clip_low = 1: no lower bound).

    Returns:
        ((B, T) loss, (B, T) float mask of tokens whose weight was clipped).
    """
    ratio = torch.exp(logprobs - old_logprobs).detach()
    weight = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    return -weight * advantages * logprobs, (weight != ratio).float()


def rollout_correction_weights(
    old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mode: RolloutCorrection, cap: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token importance weights that correct for the sampler's policy differing from the learner's
    (Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL training"; verl's
    ``rollout_is``).

    With rho = exp(old_logp - sampler_logp), the learner's over the sampler's probability of the sampled
    token: ``tis`` (truncated importance sampling) weighs each token by min(rho, cap); ``mis`` (masked
    importance sampling) by rho where rho <= cap and 0 where it exceeds the cap (the token leaves the
    loss); ``none`` by 1.

    Args:
        old_logprobs: (B, T) the learner's log-probabilities of the sampled tokens before the update.
        sampler_logprobs: (B, T) the sampler's log-probabilities of the same tokens.
        mode: ``none``, ``tis`` or ``mis``.
        cap: the ratio's cap C > 1.

    Returns:
        ((B, T) weights, detached; (B, T) float mask of tokens that were truncated or masked).
    """
    if mode == "none":
        return torch.ones_like(old_logprobs), torch.zeros_like(old_logprobs)
    rho = torch.exp(old_logprobs - sampler_logprobs).detach()
    over = rho > cap
    if mode == "tis":
        return torch.clamp(rho, max=cap), over.float()
    return torch.where(over, torch.zeros_like(rho), rho), over.float()


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: KLEstimator) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from sampled tokens (Schulman 2020 "k1/k2/k3").

    With log_ratio = logp - ref_logp: k1 = log_ratio (unbiased, can be negative), k2 = log_ratio^2 / 2,
    k3 = exp(-log_ratio) + log_ratio - 1 (unbiased, non-negative, low variance; the log-ratio is
    clamped to [-10, 10] for stability). (B, T) -> (B, T).
    """
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio**2
    log_ratio = torch.clamp(log_ratio, min=-10.0, max=10.0)
    return torch.exp(-log_ratio) + log_ratio - 1.0


def clipped_value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip: float | None
) -> torch.Tensor:
    """0.5 * (V - R)^2 per token, optionally the max with the clipped-value error (PPO2). (B, T)"""
    error = (values - returns) ** 2
    if clip is not None:
        clipped = old_values + torch.clamp(values - old_values, -clip, clip)
        error = torch.maximum(error, (clipped - returns) ** 2)
    return 0.5 * error


def dpo_loss(
    chosen_logps: torch.Tensor,
    rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float,
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Direct Preference Optimization loss per pair (Rafailov et al. 2023), conservative with
    ``label_smoothing`` (the preference label is flipped with that probability).

    With h = (logp_c - ref_c) - (logp_r - ref_r): loss = -(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h).

    Args:
        chosen_logps, rejected_logps: (P,) policy log-probabilities of each pair's sequences, summed
            over sampled tokens (with grad).
        ref_chosen_logps, ref_rejected_logps: (P,) the same under the frozen reference model.
        beta: inverse temperature of the implicit reward.
        label_smoothing: eps in [0, 0.5).

    Returns:
        ((P,) loss, (P,) implicit reward margin beta * h).
    """
    margin = beta * ((chosen_logps - ref_chosen_logps) - (rejected_logps - ref_rejected_logps))
    loss = -(1.0 - label_smoothing) * torch.nn.functional.logsigmoid(margin) - label_smoothing * (
        torch.nn.functional.logsigmoid(-margin)
    )
    return loss, margin

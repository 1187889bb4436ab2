"""Pure tensor functions for policy-gradient losses and advantages. No Ray, no I/O.

Shapes: ``B`` trajectories, ``T`` target positions (one per token after the first).
"""

from __future__ import annotations

import torch


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` where ``mask`` is 1; 0 when the mask is empty. values, mask: (B, T)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def group_normalized_advantages(rewards: torch.Tensor, groups: torch.Tensor, eps: float) -> torch.Tensor:
    """GRPO outcome advantages (Shao et al. 2024, DeepSeekMath): (r - mean_group) / (std_group + eps).

    A group of one, or a group whose rewards are all equal, gets advantage 0.

    Args:
        rewards: (B,) outcome reward per trajectory.
        groups: (B,) integer group id per trajectory (episodes of the same task share it).
        eps: added to the standard deviation.

    Returns:
        (B,) advantages.
    """
    advantages = torch.zeros_like(rewards, dtype=torch.float32)
    for group in torch.unique(groups):
        members = groups == group
        values = rewards[members].float()
        if values.numel() < 2:
            continue
        std = values.std(unbiased=True)
        if std == 0:  # every member did equally well: nothing to prefer
            continue
        advantages[members] = (values - values.mean()) / (std + eps)
    return advantages


def clipped_policy_loss(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, clip_eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate per token (Schulman et al. 2017), as a loss to minimise.

    Args:
        logprobs: (B, T) current policy log-probabilities (with grad).
        old_logprobs: (B, T) log-probabilities of the policy that sampled the data.
        advantages: (B, T) per-token advantages.
        clip_eps: ratio clip epsilon.

    Returns:
        ((B, T) loss, (B, T) float mask of tokens where clipping was active).
    """
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages
    return -torch.minimum(unclipped, clipped), (clipped < unclipped).float()


def low_variance_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, clamp: float = 10.0) -> torch.Tensor:
    """Schulman's k3 estimator of KL(policy || reference): exp(r) - r - 1 with r = ref - logp, clamped.

    Non-negative, unbiased, and low-variance. logprobs, ref_logprobs: (B, T) -> (B, T).
    """
    log_ratio = torch.clamp(ref_logprobs - logprobs, min=-clamp, max=clamp)
    return torch.clamp(torch.exp(log_ratio) - log_ratio - 1.0, min=-clamp, max=clamp)

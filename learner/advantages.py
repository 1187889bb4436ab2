"""Advantage and return estimators for multi-turn token sequences. Pure torch, no Ray, no I/O.

Shapes: ``B`` trajectories, ``T`` target positions. ``mask`` (B, T) is 1 on sampled tokens and 0 on
prompt, environment and padding tokens. Token-level estimators scan backwards over sampled tokens
only: an environment token carries the return/advantage of the next sampled token unchanged, and
the value bootstrapped at the end of a reply is the value of the first token of the next reply.
"""

from __future__ import annotations

import torch


def _group_stats(rewards: torch.Tensor, groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row group size, group sum and unbiased group std. rewards, groups: (B,) -> 3 x (B,)."""
    _, inverse = torch.unique(groups, return_inverse=True)
    n_groups = int(inverse.max()) + 1
    size = torch.zeros(n_groups).index_add_(0, inverse, torch.ones_like(rewards))
    total = torch.zeros(n_groups).index_add_(0, inverse, rewards)
    mean = total / size
    sq = torch.zeros(n_groups).index_add_(0, inverse, (rewards - mean[inverse]) ** 2)
    std = torch.sqrt(sq / (size - 1).clamp(min=1))
    return size[inverse], total[inverse], std[inverse]


def grpo_advantages(
    rewards: torch.Tensor, groups: torch.Tensor, eps: float, normalize_std: bool = True
) -> torch.Tensor:
    """GRPO (Shao et al. 2024, DeepSeekMath): (r - mean_group) / (std_group + eps) per episode.

    A group of one, or a group whose rewards are all equal, gets 0. With ``normalize_std=False``
    the advantage is r - mean_group (the Dr. GRPO variant, Liu et al. 2025).

    Args:
        rewards: (B,) outcome rewards.
        groups: (B,) group id per episode (episodes of one task share it).
        eps: added to the standard deviation.

    Returns:
        (B,) advantages.
    """
    rewards = rewards.float()
    size, total, std = _group_stats(rewards, groups)
    centred = rewards - total / size
    if normalize_std:
        centred = torch.where(std > 0, centred / (std + eps), torch.zeros_like(centred))
    return torch.where(size > 1, centred, torch.zeros_like(centred))


def uniform_groups(rewards: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """Rows whose group's rewards are all equal (a group of one included): GRPO and RLOO give every
    such row an advantage of exactly 0, so the group carries no policy-gradient signal (DAPO, Yu et al.
    2025, filters them out by "dynamic sampling").

    Args:
        rewards: (B,) outcome rewards.
        groups: (B,) group id per episode.

    Returns:
        (B,) bool.
    """
    _, _, std = _group_stats(rewards.float(), groups)
    return std == 0


def rloo_advantages(rewards: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """RLOO (Kool et al. 2019; Ahmadian et al. 2024): r_i minus the mean of the other rewards of its group.

    Args:
        rewards: (B,) outcome rewards.
        groups: (B,) group id per episode.

    Returns:
        (B,) advantages; 0 for a group of one.
    """
    rewards = rewards.float()
    size, total, _ = _group_stats(rewards, groups)
    others = (total - rewards) / (size - 1).clamp(min=1)
    return torch.where(size > 1, rewards - others, torch.zeros_like(rewards))


def discounted_returns(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = r_t + gamma * G_next over sampled tokens; environment tokens carry G_next unchanged.

    Args:
        token_rewards: (B, T) rewards, non-zero only on sampled tokens.
        mask: (B, T) 1 on sampled tokens.
        gamma: discount per sampled token.

    Returns:
        (B, T) returns on sampled tokens, 0 elsewhere.
    """
    returns = torch.zeros_like(token_rewards, dtype=torch.float32)
    running = torch.zeros(token_rewards.shape[0])
    sampled = mask.bool()
    for t in reversed(range(token_rewards.shape[1])):
        running = torch.where(sampled[:, t], token_rewards[:, t] + gamma * running, running)
        returns[:, t] = running
    return returns * mask.float()


def whiten(values: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(v - mean) / std over the masked entries of the whole batch; masked-out entries become 0. (B, T)"""
    m = mask.float()
    count = m.sum().clamp(min=1.0)
    mean = (values * m).sum() / count
    var = (((values - mean) ** 2) * m).sum() / count
    return (values - mean) / torch.sqrt(var + eps) * m


def reinforce_pp_advantages(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """REINFORCE++ (Hu 2025): discounted token returns, whitened over all sampled tokens of the batch. (B, T)"""
    return whiten(discounted_returns(token_rewards, mask, gamma), mask)


def gae(
    token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016) over sampled tokens.

    delta_t = r_t + gamma * V(next sampled token) - V(t), A_t = delta_t + gamma * lam * A(next sampled
    token). After the last sampled token the value is 0 (the episode's outcome is in its reward).

    Args:
        token_rewards: (B, T) rewards on sampled tokens.
        values: (B, T) critic values (only sampled positions are read).
        mask: (B, T) 1 on sampled tokens.
        gamma, lam: discount and GAE lambda.

    Returns:
        ((B, T) advantages, (B, T) returns = advantages + values), zero off the mask.
    """
    advantages = torch.zeros_like(token_rewards, dtype=torch.float32)
    next_value = torch.zeros(token_rewards.shape[0])
    next_advantage = torch.zeros(token_rewards.shape[0])
    sampled = mask.bool()
    for t in reversed(range(token_rewards.shape[1])):
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        next_value = torch.where(sampled[:, t], values[:, t], next_value)
        next_advantage = torch.where(sampled[:, t], advantage, next_advantage)
        advantages[:, t] = torch.where(sampled[:, t], advantage, torch.zeros_like(advantage))
    m = mask.float()
    return advantages, (advantages + values) * m

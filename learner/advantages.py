"""Advantage and return estimators for multi-turn token sequences. Pure torch, no Ray, no I/O.

Shapes: ``B`` trajectories, ``T`` target positions, ``K`` turns (the most of any row). ``mask`` (B, T)
is 1 on sampled tokens and 0 on prompt, environment and padding tokens. Token-level estimators scan
backwards over sampled tokens only: an environment token carries the return/advantage of the next
sampled token unchanged, and the value bootstrapped at the end of a reply is the value of the first
token of the next reply. Turn-level estimators work on (B, K) tables built from ``turn_ids`` (B, T),
the turn index on each reply token and -1 elsewhere, and spread their values back onto the tokens.
"""

from __future__ import annotations

import torch


def _group_stats(
    values: torch.Tensor, groups: torch.Tensor, counted: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row group size, group sum and unbiased group std, over the rows ``counted`` (all when None): an
    episode's later segments share its reward and are not counted again. values, groups, counted: (B,) -> 3 x (B,)."""
    _, inverse = torch.unique(groups, return_inverse=True)
    n_groups = int(inverse.max()) + 1
    weight = torch.ones_like(values) if counted is None else counted.to(values.dtype)
    size = torch.zeros(n_groups).index_add_(0, inverse, weight)
    total = torch.zeros(n_groups).index_add_(0, inverse, weight * values)
    mean = total / size.clamp(min=1)
    sq = torch.zeros(n_groups).index_add_(0, inverse, weight * (values - mean[inverse]) ** 2)
    std = torch.sqrt(sq / (size - 1).clamp(min=1))
    return size[inverse], total[inverse], std[inverse]


def grpo_advantages(
    rewards: torch.Tensor,
    groups: torch.Tensor,
    eps: float,
    normalize_std: bool = True,
    counted: torch.Tensor | None = None,
) -> torch.Tensor:
    """GRPO (Shao et al. 2024, DeepSeekMath): (r - mean_group) / (std_group + eps) per episode.

    A group of one, or a group whose rewards are all equal, gets 0. With ``normalize_std=False``
    the advantage is r - mean_group (the Dr. GRPO variant, Liu et al. 2025).

    Args:
        rewards: (B,) outcome rewards.
        groups: (B,) group id per episode (episodes of one task share it).
        eps: added to the standard deviation.
        counted: (B,) 1 on the rows the group statistics count (an episode's first segment), 0 on an
            episode's later segments, which carry its reward; None: every row is an episode.

    Returns:
        (B,) advantages.
    """
    rewards = rewards.float()
    size, total, std = _group_stats(rewards, groups, counted)
    centred = rewards - total / size.clamp(min=1)
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


def rloo_advantages(rewards: torch.Tensor, groups: torch.Tensor, counted: torch.Tensor | None = None) -> torch.Tensor:
    """RLOO (Kool et al. 2019; Ahmadian et al. 2024): r_i minus the mean of the other rewards of its group.

    Args:
        rewards: (B,) outcome rewards.
        groups: (B,) group id per episode.
        counted: (B,) as in :func:`grpo_advantages`: a later segment carries its episode's reward, so the
            mean of the other episodes leaves out its own.

    Returns:
        (B,) advantages; 0 for a group of one.
    """
    rewards = rewards.float()
    size, total, _ = _group_stats(rewards, groups, counted)
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


def turn_rewards(token_rewards: torch.Tensor, turn_ids: torch.Tensor) -> torch.Tensor:
    """The reward of each turn: the sum of ``token_rewards`` (B, T) over that turn's reply tokens. -> (B, K)"""
    on_turn = turn_ids >= 0
    num_turns = int(turn_ids.max().clamp(min=0)) + 1
    sums = torch.zeros(turn_ids.shape[0], num_turns, device=turn_ids.device)
    return sums.scatter_add_(1, turn_ids.clamp(min=0), torch.where(on_turn, token_rewards.float(), 0.0))


def discounted_turn_returns(rewards: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_k = r_k + gamma * G_{k+1} over turns: the discount counts turns, not tokens. (B, K) -> (B, K)

    Turns past a row's last have reward 0, so they add nothing to its returns.
    """
    returns = torch.zeros_like(rewards, dtype=torch.float32)
    running = torch.zeros(rewards.shape[0], device=rewards.device)
    for k in reversed(range(rewards.shape[1])):
        running = rewards[:, k] + gamma * running
        returns[:, k] = running
    return returns


def spread_turns(values: torch.Tensor, turn_ids: torch.Tensor) -> torch.Tensor:
    """Each reply token gets its turn's value; other tokens get 0. values (B, K), turn_ids (B, T) -> (B, T)"""
    gathered = values.gather(1, turn_ids.clamp(min=0))
    return torch.where(turn_ids >= 0, gathered, torch.zeros_like(gathered))


def turn_states(state_ids: torch.Tensor, turn_ids: torch.Tensor) -> torch.Tensor:
    """The state id each turn acted from (-1: none, or no such turn), read off its reply tokens.

    Args:
        state_ids: (B, T) state id on the reply tokens of a turn, -1 elsewhere.
        turn_ids: (B, T) turn index on reply tokens, -1 elsewhere.

    Returns:
        (B, K) long.
    """
    num_turns = int(turn_ids.max().clamp(min=0)) + 1
    states = torch.full((turn_ids.shape[0], num_turns), -1, dtype=torch.long, device=turn_ids.device)
    # Every token of a turn carries the same id, and -1 never wins the max over a real one.
    return states.scatter_reduce_(1, turn_ids.clamp(min=0), state_ids, reduce="amax")


def grpo_turn_advantages(
    returns: torch.Tensor,
    groups: torch.Tensor,
    eps: float,
    normalize_std: bool = True,
    counted: torch.Tensor | None = None,
) -> torch.Tensor:
    """GRPO with turn-level credit: each turn's return, centred (and scaled) by the statistics of its
    group's episode returns (the returns from the first turn, G_0).

    With outcome-only rewards and no discount every turn's return is the episode's reward, and this is
    :func:`grpo_advantages` on every turn. A group of one, or one whose episode returns are all equal,
    gets 0 (with ``normalize_std``) like GRPO.

    Args:
        returns: (B, K) discounted turn returns (:func:`discounted_turn_returns`).
        groups: (B,) group id per episode.
        eps: added to the standard deviation.
        normalize_std: divide by the group std of G_0 (False: Dr. GRPO's centring only).
        counted: (B,) the rows whose G_0 is an episode's return (its first segment); None: all.

    Returns:
        (B, K) advantages.
    """
    size, total, std = _group_stats(returns[:, 0], groups, counted)
    centred = returns - (total / size.clamp(min=1))[:, None]
    if normalize_std:
        centred = torch.where(std[:, None] > 0, centred / (std[:, None] + eps), torch.zeros_like(centred))
    return torch.where(size[:, None] > 1, centred, torch.zeros_like(centred))


def rloo_turn_advantages(
    returns: torch.Tensor, groups: torch.Tensor, counted: torch.Tensor | None = None
) -> torch.Tensor:
    """RLOO with turn-level credit: each turn's return minus the mean episode return (G_0) of the other
    episodes of its group; 0 for a group of one. returns (B, K), groups (B,), counted (B,) as in
    :func:`grpo_turn_advantages` -> (B, K). A later segment's own return is left out in place of its
    episode's: the same under outcome rewards, which reach every segment whole."""
    size, total, _ = _group_stats(returns[:, 0], groups, counted)
    others = (total - returns[:, 0]) / (size - 1).clamp(min=1)
    return torch.where(size[:, None] > 1, returns - others[:, None], torch.zeros_like(returns))


def gigpo_step_advantages(
    returns: torch.Tensor, states: torch.Tensor, groups: torch.Tensor, eps: float, normalize_std: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """GiGPO's step-level advantages (Feng et al. 2025, arXiv 2505.10978, Eq. 6-7).

    The turns of one group's episodes that acted from the same state (an "anchor state", revisits within
    an episode included) form a step group; each turn's discounted return is compared within its step
    group as GRPO compares episodes: (G - mean) / (std + eps), or G - mean without ``normalize_std``.
    A step group of one, a turn without a state and a missing turn get 0.

    Args:
        returns: (B, K) discounted turn returns (:func:`discounted_turn_returns`).
        states: (B, K) state id per turn, -1 for none (:func:`turn_states`).
        groups: (B,) episode group id per row.
        eps: added to the standard deviation.
        normalize_std: divide by the step group's std.

    Returns:
        ((B, K) advantages, (B, K) bool: the turn's step group has another member).
    """
    anchored = states >= 0
    advantages = torch.zeros_like(returns, dtype=torch.float32)
    shared = torch.zeros_like(anchored)
    if not anchored.any():
        return advantages, shared
    rows = anchored.nonzero()[:, 0]
    # One id per (episode group, state) pair: states are only compared within a task's group.
    pairs = torch.stack([groups[rows], states[anchored]], dim=1)  # (N, 2), N anchored turns
    _, step_groups, sizes = torch.unique(pairs, dim=0, return_inverse=True, return_counts=True)
    advantages[anchored] = grpo_advantages(returns[anchored], step_groups, eps, normalize_std)
    shared[anchored] = sizes[step_groups] > 1
    return advantages, shared

"""Vanilla REINFORCE as a surrogate loss of every policy-gradient algorithm: ``algorithm.policy_loss: reinforce``
after importing this module."""

from __future__ import annotations

import torch

from agentgym_rl.learner import PolicyGradientParams, register_policy_loss


@register_policy_loss("reinforce")
def reinforce_loss(
    *,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: PolicyGradientParams,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE (Williams 1992): -A * log pi per token, without a ratio or a clip. (B, T) -> (B, T)."""
    return -advantages * logprobs, torch.zeros_like(logprobs)  # nothing is ever clipped

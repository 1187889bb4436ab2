"""Trajectories -> padded tensors for the learner."""

from __future__ import annotations

import torch

from actors.trajectory import Trajectory


def collate(trajectories: list[Trajectory], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-pad ``trajectories`` into one batch.

    Returns a dict with ``input_ids`` and ``attention_mask`` of shape (B, L); ``loss_mask``,
    ``sampler_logprobs`` and ``token_rewards`` of shape (B, L-1), aligned with next-token targets
    (position t predicts token t+1); ``rewards`` and ``groups`` of shape (B,). The outcome reward
    sits on the last sampled token of each trajectory (never on an environment token).
    """
    batch = len(trajectories)
    width = max(len(t.token_ids) for t in trajectories)
    input_ids = torch.full((batch, width), pad_token_id, dtype=torch.long)
    attention = torch.zeros((batch, width), dtype=torch.long)
    loss_mask = torch.zeros((batch, width - 1), dtype=torch.float32)
    sampler_logprobs = torch.zeros((batch, width - 1), dtype=torch.float32)
    token_rewards = torch.zeros((batch, width - 1), dtype=torch.float32)
    for row, traj in enumerate(trajectories):
        n = len(traj.token_ids)
        input_ids[row, :n] = torch.tensor(traj.token_ids)
        attention[row, :n] = 1
        # The first token is never predicted; targets are tokens 1..n-1.
        loss_mask[row, : n - 1] = torch.tensor(traj.loss_mask[1:], dtype=torch.float32)
        sampler_logprobs[row, : n - 1] = torch.tensor(traj.logprobs[1:], dtype=torch.float32)
        sampled = loss_mask[row].nonzero()
        if len(sampled):
            token_rewards[row, int(sampled[-1])] = traj.reward
    return {
        "input_ids": input_ids,
        "attention_mask": attention,
        "loss_mask": loss_mask,
        "sampler_logprobs": sampler_logprobs,
        "token_rewards": token_rewards,
        "rewards": torch.tensor([t.reward for t in trajectories], dtype=torch.float32),
        "groups": torch.tensor([t.group for t in trajectories], dtype=torch.long),
    }


def select_rows(batch: dict[str, torch.Tensor], rows: slice) -> dict[str, torch.Tensor]:
    """A micro-batch of ``rows``, trimmed to its own longest sequence."""
    part = {key: value[rows] for key, value in batch.items()}
    width = int(part["attention_mask"].sum(-1).max())
    for key in ("input_ids", "attention_mask"):
        part[key] = part[key][:, :width]
    for key, value in part.items():
        if value.dim() == 2 and key not in ("input_ids", "attention_mask"):
            part[key] = value[:, : width - 1]
    return part

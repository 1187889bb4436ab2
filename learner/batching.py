"""Trajectories -> tensors for the learner: padded batches, micro-batches, and packed rows."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agentgym_rl.actors.trajectory import Trajectory

TOKEN_COLUMNS = ("input_ids", "attention_mask")


def collate(trajectories: list[Trajectory], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-pad ``trajectories`` into one batch.

    Returns a dict with ``input_ids`` and ``attention_mask`` of shape (B, L); ``loss_mask``,
    ``sampler_logprobs``, ``token_rewards``, ``turn_ids``, ``state_ids`` and ``turn_capped`` of shape
    (B, L-1), aligned with next-token targets (position t predicts token t+1); ``rewards``, ``groups``,
    ``counted`` and ``truncated`` of shape (B,). ``counted`` is 1 on an episode's first segment (every row of
    a batch played by samplers) and 0 on its later ones: group statistics count episodes, not segments.
    Each turn's environment reward sits on the last sampled token of that turn's reply (never on
    an environment token), so the rewards on a row sum to the episode's outcome. ``turn_ids`` is the
    turn's index (0, 1, ...) on its reply tokens and -1 elsewhere; ``state_ids`` numbers the distinct
    env state keys of the batch (equal keys, equal ids) on the reply tokens of the turn that acted from
    that state, -1 where there is none; ``turn_capped`` is 1 on the last token of a reply cut by the
    per-turn token cap.
    """
    batch = len(trajectories)
    width = max(len(t.token_ids) for t in trajectories)
    input_ids = torch.full((batch, width), pad_token_id, dtype=torch.long)
    attention = torch.zeros((batch, width), dtype=torch.long)
    loss_mask = torch.zeros((batch, width - 1), dtype=torch.float32)
    sampler_logprobs = torch.zeros((batch, width - 1), dtype=torch.float32)
    token_rewards = torch.zeros((batch, width - 1), dtype=torch.float32)
    turn_ids = torch.full((batch, width - 1), -1, dtype=torch.long)
    state_ids = torch.full((batch, width - 1), -1, dtype=torch.long)
    turn_capped = torch.zeros((batch, width - 1), dtype=torch.float32)
    states: dict[str, int] = {}  # state-key digest -> id, in order of first appearance
    for row, traj in enumerate(trajectories):
        n = len(traj.token_ids)
        input_ids[row, :n] = torch.tensor(traj.token_ids)
        attention[row, :n] = 1
        # The first token is never predicted; targets are tokens 1..n-1 at positions 0..n-2.
        loss_mask[row, : n - 1] = torch.tensor(traj.loss_mask[1:], dtype=torch.float32)
        sampler_logprobs[row, : n - 1] = torch.tensor(traj.logprobs[1:], dtype=torch.float32)
        for (start, end), reward in zip(traj.turn_spans, traj.step_rewards, strict=False):
            if end > start:
                token_rewards[row, end - 2] += reward  # token end-1 is predicted at position end-2
        for turn, (start, end) in enumerate(traj.turn_spans):
            turn_ids[row, start - 1 : end - 1] = turn  # reply tokens start..end-1 sit at start-1..end-2
            key = traj.state_keys[turn] if turn < len(traj.state_keys) else None
            if key is not None:
                state_ids[row, start - 1 : end - 1] = states.setdefault(key, len(states))
            if end > start and turn < len(traj.turn_capped) and traj.turn_capped[turn]:
                turn_capped[row, end - 2] = 1.0
    return {
        "input_ids": input_ids,
        "attention_mask": attention,
        "loss_mask": loss_mask,
        "sampler_logprobs": sampler_logprobs,
        "token_rewards": token_rewards,
        "turn_ids": turn_ids,
        "state_ids": state_ids,
        "turn_capped": turn_capped,
        "rewards": torch.tensor([t.reward for t in trajectories], dtype=torch.float32),
        "groups": torch.tensor([t.group for t in trajectories], dtype=torch.long),
        "counted": torch.tensor([t.segment == 0 for t in trajectories], dtype=torch.float32),
        "truncated": torch.tensor([t.truncated for t in trajectories], dtype=torch.bool),
    }


def select_rows(batch: dict[str, torch.Tensor], rows: torch.Tensor) -> dict[str, torch.Tensor]:
    """The sub-batch of ``rows`` (index tensor), trimmed to its own longest sequence."""
    part = {key: value[rows] for key, value in batch.items()}
    width = int(part["attention_mask"].sum(-1).max())
    for key, value in part.items():
        if value.dim() == 2:
            part[key] = value[:, :width] if key in TOKEN_COLUMNS else value[:, : width - 1]
    return part


@dataclass(frozen=True)
class PackedRows:
    """Several sequences per row, each attending only to itself.

    ``segments[r]`` lists ``(sequence index, offset, length)`` of row r. ``attention_mask`` is
    (R, 1, L, L) boolean, causal within each segment; ``position_ids`` restart at 0 per segment.
    """

    input_ids: torch.Tensor  # (R, L)
    position_ids: torch.Tensor  # (R, L)
    attention_mask: torch.Tensor  # (R, 1, L, L)
    target_mask: torch.Tensor  # (R, L-1)
    segments: list[list[tuple[int, int, int]]]


def plan_rows(lengths: list[int], capacity: int) -> list[list[int]]:
    """First-fit decreasing: sequence indices per row, each row holding at most ``capacity`` tokens.

    Deterministic (ties keep index order). A sequence longer than ``capacity`` gets a row of its own.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    rows: list[list[int]] = []
    free: list[int] = []
    for index in order:
        for r, space in enumerate(free):
            if lengths[index] <= space:
                rows[r].append(index)
                free[r] -= lengths[index]
                break
        else:
            rows.append([index])
            free.append(capacity - lengths[index])
    return rows


def pack(
    input_ids: torch.Tensor, lengths: torch.Tensor, target_mask: torch.Tensor, rows: list[list[int]], pad_token_id: int
) -> PackedRows:
    """Lay out the padded sequences (``input_ids`` (B, L0), ``target_mask`` (B, L0-1)) into ``rows``."""
    width = max(sum(int(lengths[i]) for i in members) for members in rows)
    n_rows = len(rows)
    ids = torch.full((n_rows, width), pad_token_id, dtype=torch.long)
    positions = torch.zeros((n_rows, width), dtype=torch.long)
    segment_of = torch.full((n_rows, width), -1, dtype=torch.long)
    targets = torch.zeros((n_rows, width - 1), dtype=target_mask.dtype)
    segments: list[list[tuple[int, int, int]]] = []
    for r, members in enumerate(rows):
        offset, placed = 0, []
        for k, index in enumerate(members):
            n = int(lengths[index])
            ids[r, offset : offset + n] = input_ids[index, :n]
            positions[r, offset : offset + n] = torch.arange(n)
            segment_of[r, offset : offset + n] = k
            # Targets stay inside the segment; the boundary position (predicting the next
            # segment's first token) keeps mask 0.
            targets[r, offset : offset + n - 1] = target_mask[index, : n - 1]
            placed.append((index, offset, n))
            offset += n
        segments.append(placed)
    causal = torch.tril(torch.ones(width, width, dtype=torch.bool))
    same = (segment_of[:, :, None] == segment_of[:, None, :]) & (segment_of[:, :, None] >= 0)
    # Padding positions attend to themselves only, so no row of the mask is empty.
    eye = torch.eye(width, dtype=torch.bool)[None]
    attention = ((same & causal) | eye)[:, None]  # (R, 1, L, L)
    return PackedRows(ids, positions, attention, targets, segments)


def unpack_targets(values: torch.Tensor, packed: PackedRows, shape: torch.Size) -> torch.Tensor:
    """Per-target values (R, L-1) of packed rows back to the padded layout ``shape`` (B, L0-1)."""
    out = torch.zeros(shape, dtype=values.dtype, device=values.device)
    rows, cols, dest_rows, dest_cols = [], [], [], []
    for r, placed in enumerate(packed.segments):
        for index, offset, n in placed:
            span = torch.arange(n - 1)
            rows.append(torch.full_like(span, r))
            cols.append(span + offset)
            dest_rows.append(torch.full_like(span, index))
            dest_cols.append(span)
    src = values[torch.cat(rows), torch.cat(cols)]
    return out.index_put((torch.cat(dest_rows), torch.cat(dest_cols)), src)

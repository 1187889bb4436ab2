"""Trajectory records for tests, from what a test cares about; the other fields follow from those."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentgym_rl.actors.trajectory import Trajectory, sampled_spans


def make_trajectory(
    token_ids: list[int],
    loss_mask: list[int],
    step_rewards: list[float],
    *,
    group: int = 0,
    truncated: bool = False,
    **fields: Any,
) -> Trajectory:
    """A well-formed episode of ``group``: one turn per reward, the turns where ``loss_mask`` is 1.

    Unless given in ``fields``: the task id is the group, log-probs are -1 on sampled tokens, the reward is
    the sum of the step rewards and success means it is positive, an untruncated episode is done, a
    truncated one was cut by its horizon (the number of turns), env ``babyai``, weights version 0.
    """
    reward = sum(step_rewards)
    defaults: dict[str, Any] = {
        "env": "babyai",
        "task_id": group,
        "logprobs": [-1.0 if bit else 0.0 for bit in loss_mask],
        "prompt_length": loss_mask.index(1) if 1 in loss_mask else len(loss_mask),
        "turn_spans": sampled_spans(loss_mask),
        "messages": [],
        "actions": ["a"] * len(step_rewards),
        "reward": reward,
        "success": reward > 0,
        "done": not truncated,
        "truncation_reason": "horizon" if truncated else None,
        "horizon": len(step_rewards),
        "weights_version": 0,
    }
    return Trajectory(
        token_ids=token_ids,
        loss_mask=loss_mask,
        step_rewards=step_rewards,
        group=group,
        truncated=truncated,
        **{**defaults, **fields},
    )


# The full-weights recipe (the quickstart before LoRA): the base config of tests that train from scratch with
# tiny-random or SmolLM2 and set what they test on top (configs/quickstart.yaml starts from a committed adapter).
RECIPE = str(Path(__file__).resolve().parents[1] / "configs" / "warm_start_grpo.yaml")

"""The record of one episode, as samplers produce it and the learner and run directory consume it."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class Trajectory(BaseModel):
    """One multi-turn episode, token-exact.

    ``token_ids`` is the whole conversation; ``loss_mask[i]`` is 1 exactly where ``token_ids[i]``
    was sampled by the policy, and ``logprobs[i]`` is the sampler's log-probability there (0
    elsewhere). ``turn_spans`` are the ``[start, end)`` ranges of the sampled replies.
    """

    model_config = ConfigDict(extra="forbid")

    env: str
    task_id: int
    group: int = Field(description="Index of the task within its iteration; episodes of one task share it.")
    segment: int = Field(
        0,
        description="Which segment of its episode this is: 0 for an episode's first (or only) one. An episode "
        "recorded on the endpoint whose client rewrote its history (`serve.episodes.on_rewrite: segment`) has "
        "later ones, which follow it in a batch and which group statistics do not count as episodes again.",
    )
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    prompt_length: int = Field(description="Tokens before the first sampled reply.")
    turn_spans: list[tuple[int, int]]
    messages: list[dict[str, str]] = Field(description="The conversation as text (for logs and the viewer).")
    actions: list[str] = Field(
        description="What each turn sent to the environment: the raw reply (`env.action_format: text`), or the "
        'action text of the reply\'s first call (`tools`; "" where the reply made no call the env accepted).'
    )
    step_rewards: list[float] = Field(description="Environment reward of each turn.")
    state_keys: list[str | None] = Field(
        default_factory=list,
        description="Digest of the env's state key before each turn (the state the turn acted from; GiGPO's "
        "anchor states); None where the env has no state key. Empty in records made before it existed.",
    )
    turn_capped: list[bool] = Field(
        default_factory=list,
        description="Whether each turn's reply was cut by the per-turn token cap (`max_new_tokens`, finish "
        "reason `length`). Empty in records made before it existed.",
    )
    reward: float = Field(
        description="Outcome reward: the sum of step rewards (for a segment, of its whole episode's, which every "
        "segment carries)."
    )
    success: bool
    done: bool = Field(description="The environment ended the episode.")
    truncated: bool = Field(description="The episode was cut by a limit before the environment ended it.")
    truncation_reason: Literal["horizon", "context"] | None = None
    horizon: int = Field(description="Turn limit in force when the episode started.")
    weights_version: int = Field(
        description="Oldest policy version that sampled a reply of the episode (a weight swap may land "
        "between two turns in async mode; staleness is judged by the oldest); -1 when nothing was sampled."
    )
    failed: bool = Field(False, description="The env failed (died or timed out) twice; not trained on.")
    failure_reason: str | None = Field(None, description="Why the episode failed, when it did.")

    @classmethod
    def failure(cls, *, env: str, task_id: int, group: int, horizon: int, reason: str) -> Trajectory:
        """The record of an episode that could not be played; it carries no tokens."""
        return cls(
            env=env,
            task_id=task_id,
            group=group,
            token_ids=[],
            loss_mask=[],
            logprobs=[],
            prompt_length=0,
            turn_spans=[],
            messages=[],
            actions=[],
            step_rewards=[],
            reward=0.0,
            success=False,
            done=False,
            truncated=False,
            horizon=horizon,
            weights_version=-1,
            failed=True,
            failure_reason=reason,
        )

    @property
    def num_turns(self) -> int:
        return len(self.turn_spans)

    @property
    def num_sampled_tokens(self) -> int:
        return sum(self.loss_mask)


def sampled_spans(loss_mask: list[int]) -> list[tuple[int, int]]:
    """``[start, end)`` of each run of 1s in ``loss_mask``: the turns' sampled replies."""
    spans, start = [], None
    for i, bit in enumerate([*loss_mask, 0]):
        if bit and start is None:
            start = i
        elif not bit and start is not None:
            spans.append((start, i))
            start = None
    return spans

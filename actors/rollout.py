"""One episode as a coroutine: generate, step the environment, repeat, token-exact."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from agentgym_rl.actors.chat import ChatFormat
from agentgym_rl.actors.engines.base import Generation
from agentgym_rl.actors.trajectory import Trajectory
from agentgym_rl.envs.base import Observation, StepResult

# (prompt ids) -> (generation, weights version that produced it)
GenerateFn = Callable[[list[int]], Awaitable[tuple[Generation, int]]]
ResetFn = Callable[[int], Awaitable[Observation]]
StepFn = Callable[[str], Awaitable[StepResult]]


async def run_episode(
    *,
    env_name: str,
    instruction: str,
    reset: ResetFn,
    step: StepFn,
    generate: GenerateFn,
    chat: ChatFormat,
    task_id: int,
    group: int,
    horizon: int,
    max_new_tokens: int,
    max_context_tokens: int,
) -> Trajectory:
    """Play ``task_id`` for at most ``horizon`` turns within ``max_context_tokens``.

    The episode stops when the environment says ``done``, after ``horizon`` replies, or when the
    next turn could overflow ``max_context_tokens`` (``truncated`` with the reason in the last two
    cases); ``token_ids`` never exceeds the context limit and always ends on a sampled token. Each turn
    records the env's state key it acted from and whether its reply hit ``max_new_tokens``.
    """
    first = await reset(task_id)
    messages = [{"role": "system", "content": instruction}, {"role": "user", "content": first.text}]
    token_ids = chat.prompt_ids(messages)
    loss_mask = [0] * len(token_ids)
    logprobs = [0.0] * len(token_ids)
    prompt_length = len(token_ids)
    turn_spans: list[tuple[int, int]] = []
    actions: list[str] = []
    step_rewards: list[float] = []
    state_keys: list[str | None] = []
    turn_capped: list[bool] = []
    state_key = first.state_key
    weights_version: int | None = None
    done = success = False
    truncation_reason = None

    if len(token_ids) + max_new_tokens > max_context_tokens:
        truncation_reason = "context"
    while truncation_reason is None:
        generation, version = await generate(token_ids)
        weights_version = version if weights_version is None else min(weights_version, version)
        start = len(token_ids)
        token_ids += generation.token_ids
        loss_mask += [1] * len(generation.token_ids)
        logprobs += generation.logprobs
        turn_spans.append((start, len(token_ids)))
        state_keys.append(state_key)
        turn_capped.append(generation.finish_reason == "length")

        reply = chat.decode_reply(generation.token_ids)
        actions.append(reply)
        messages.append({"role": "assistant", "content": reply})
        result = await step(reply)
        step_rewards.append(result.reward)
        state_key = result.state_key
        if result.done:
            done = True
            success = bool(result.info.get("success", result.reward > 0))
            break
        # The last observation is kept as text for the record; its ids are only appended when
        # another reply follows, so token_ids always ends on a sampled token.
        messages.append({"role": "user", "content": result.observation})
        if len(turn_spans) >= horizon:
            truncation_reason = "horizon"
            break
        continuation = chat.continuation_ids(generation.token_ids, result.observation)
        if len(token_ids) + len(continuation) + max_new_tokens > max_context_tokens:
            truncation_reason = "context"
            break
        token_ids += continuation
        loss_mask += [0] * len(continuation)
        logprobs += [0.0] * len(continuation)

    return Trajectory(
        env=env_name,
        task_id=task_id,
        group=group,
        token_ids=token_ids,
        loss_mask=loss_mask,
        logprobs=logprobs,
        prompt_length=prompt_length,
        turn_spans=turn_spans,
        messages=messages,
        actions=actions,
        step_rewards=step_rewards,
        state_keys=state_keys,
        turn_capped=turn_capped,
        reward=float(sum(step_rewards)),
        success=success,
        done=done,
        truncated=truncation_reason is not None,
        truncation_reason=truncation_reason,
        horizon=horizon,
        weights_version=weights_version if weights_version is not None else -1,
    )

"""One episode as a coroutine: generate, step the environment, repeat, token-exact.

In ``env.action_format: text`` each reply is sent to the env as it is and the observation comes back as the next
user turn. In ``tools`` (:class:`ToolActions`) the env's functions are offered in the opening, each reply is parsed
by the tool format, its first call becomes the env's action, and the observation comes back as that call's result.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from agentgym_rl.actors.chat import ChatFormat
from agentgym_rl.actors.engines.base import Generation
from agentgym_rl.actors.tool_formats import ToolChat
from agentgym_rl.actors.trajectory import Trajectory
from agentgym_rl.envs.base import InvalidAction, Observation, StepResult
from agentgym_rl.envs.tools import Function, ToolCall

# (prompt ids) -> (generation, weights version that produced it)
GenerateFn = Callable[[list[int]], Awaitable[tuple[Generation, int]]]
ResetFn = Callable[[int], Awaitable[Observation]]
StepFn = Callable[[str], Awaitable[StepResult]]
# (call) -> (action text sent to the env, step result), or why the call stands for no action (env not stepped)
StepCallFn = Callable[[ToolCall], Awaitable[tuple[str, StepResult] | InvalidAction]]

NOT_EXECUTED = "Not executed: only the first function call of a reply is executed. Make one call per turn."


@dataclass(frozen=True)
class ToolActions:
    """How an episode in ``env.action_format: tools`` talks to its env.

    Attributes:
        chat: renders the opening with the functions and appends each turn's results after the sampled reply.
        functions: the env's functions (``TextEnv.functions``).
        step_call: steps the env on a call (``EnvHost.step_call``).
    """

    chat: ToolChat
    functions: list[Function]
    step_call: StepCallFn


async def tool_turn(
    tools: ToolActions, reply: str, turn: int, state_key: str | None
) -> tuple[str, StepResult, list[dict[str, Any]]]:
    """Act on one sampled ``reply`` in tool format.

    The reply's first call is the turn's action; every other call is answered with :data:`NOT_EXECUTED`. A reply
    with no call, or one whose call does not parse, leaves the env unstepped: the turn counts (reward 0, the state
    key unchanged) and a user message says what was wrong. So does a call the env refuses (unknown function,
    arguments outside its schema), whose result says why.

    Returns:
        The action text sent to the env ("" when none was), the step result, and the messages that answer the
        reply: the calls' ``tool`` results, or one ``user`` message.
    """
    parsed = tools.chat.format.parse(reply, call_id=lambda index: f"call_{turn}_{index}")
    if parsed.error is not None or not parsed.calls:
        names = ", ".join(f.name for f in tools.functions)
        problem = (
            f"Your function call could not be read: {parsed.error}."
            if parsed.error is not None
            else "Your reply made no function call."
        )
        reason = f"{problem} Act by calling one of the functions ({names}), one call per turn."
        return "", _not_stepped(reason, state_key), [{"role": "user", "content": reason}]
    first, *others = parsed.calls
    outcome = await tools.step_call(first)
    if isinstance(outcome, InvalidAction):
        action, result = "", _not_stepped(outcome.reason, state_key)
    else:
        action, result = outcome
    answers = [{"role": "tool", "tool_call_id": first.id, "content": result.observation}]
    answers += [{"role": "tool", "tool_call_id": call.id, "content": NOT_EXECUTED} for call in others]
    return action, result, answers


def _not_stepped(reason: str, state_key: str | None) -> StepResult:
    """The result of a turn whose reply gave the env no action: as an invalid action's, with the env untouched."""
    return StepResult(observation=reason, reward=0.0, done=False, info={"action_valid": False}, state_key=state_key)


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
    tools: ToolActions | None = None,
) -> Trajectory:
    """Play ``task_id`` for at most ``horizon`` turns within ``max_context_tokens``.

    The episode stops when the environment says ``done``, after ``horizon`` replies, or when the
    next turn could overflow ``max_context_tokens`` (``truncated`` with the reason in the last two
    cases); ``token_ids`` never exceeds the context limit and always ends on a sampled token. Each turn
    records the env's state key it acted from and whether its reply hit ``max_new_tokens``.

    With ``tools`` the episode is played in tool format (:func:`tool_turn`; ``step`` is unused): ``actions``
    records the action text each turn sent to the env ("" where it sent none), and ``messages`` is the
    conversation as plain text (``ToolFormat.plain_messages``: the functions in the system message, the
    results as user turns).
    """
    first = await reset(task_id)
    messages = [{"role": "system", "content": instruction}, {"role": "user", "content": first.text}]
    token_ids = chat.prompt_ids(messages) if tools is None else tools.chat.prompt_ids(messages, tools.functions)
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
        messages.append({"role": "assistant", "content": reply})
        if tools is None:
            action, result = reply, await step(reply)
            answers = [{"role": "user", "content": result.observation}]
        else:
            action, result, answers = await tool_turn(tools, reply, len(turn_spans) - 1, state_key)
        actions.append(action)
        step_rewards.append(result.reward)
        state_key = result.state_key
        if result.done:
            done = True
            success = bool(result.info.get("success", result.reward > 0))
            break
        # The last observation is kept as text for the record; its ids are only appended when
        # another reply follows, so token_ids always ends on a sampled token.
        messages += answers
        if len(turn_spans) >= horizon:
            truncation_reason = "horizon"
            break
        if tools is None:
            continuation = chat.continuation_ids(generation.token_ids, result.observation)
        else:
            continuation = tools.chat.continuation_ids(generation.token_ids, answers)
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
        messages=messages if tools is None else tools.chat.format.plain_messages(messages, tools.functions),
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

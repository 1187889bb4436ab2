"""Episodes in tool format (``env.action_format: tools``): the rollout coroutine on in-process env hosts, with
scripted replies (the env's oracle written as calls, replies without a call, refused calls, parallel calls) and
with tiny-random's own replies."""

from __future__ import annotations

import asyncio

import pytest

from agentgym_rl.actors.chat import ChatFormat
from agentgym_rl.actors.engines import Generation
from agentgym_rl.actors.rollout import NOT_EXECUTED, ToolActions, run_episode
from agentgym_rl.actors.tool_formats import HermesFormat, ToolChat
from agentgym_rl.configs.schema import SamplingConfig
from agentgym_rl.envs.actor import EnvHost
from agentgym_rl.envs.base import InvalidAction
from agentgym_rl.envs.tools import ToolCall
from tests.unit.actors.helpers import tiny_engine

FMT = HermesFormat()


@pytest.fixture(scope="module")
def tool_chat(tokenizer) -> ToolChat:
    return ToolChat(ChatFormat(tokenizer), FMT, "auto")


def play(tool_chat, host, task_id, generate, *, horizon=20, max_context_tokens=16000):
    """One episode of ``host``'s env in tool format; ``generate(prompt, turn)`` returns the reply's ids. Returns
    the trajectory and the conversation in OpenAI's form (what the ids should render)."""
    conversation = []
    results = []  # what step_call returned, turn by turn

    async def reset(task):
        observation = host.reset(task)
        conversation.extend(
            [{"role": "system", "content": host.tool_instruction()}, {"role": "user", "content": observation.text}]
        )
        return observation

    async def step_call(call):
        results.append(host.step_call(call))
        return results[-1]

    async def generate_turn(prompt):
        ids = generate(prompt, len(results))
        return Generation(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop"), 0

    async def step(text):
        raise AssertionError("an episode in tool format steps the env by calls only")

    tools = ToolActions(chat=tool_chat, functions=host.functions(), step_call=step_call)
    trajectory = asyncio.run(
        run_episode(
            env_name=host.env.name,
            instruction=host.tool_instruction(),
            reset=reset,
            step=step,
            generate=generate_turn,
            chat=tool_chat.chat,
            task_id=task_id,
            group=0,
            horizon=horizon,
            max_new_tokens=200,
            max_context_tokens=max_context_tokens,
            tools=tools,
        )
    )
    return trajectory, results, tools


def reply_ids(tool_chat, text):
    return [*tool_chat.chat.encode(text), tool_chat.chat.tokenizer.eos_token_id]


@pytest.mark.parametrize(
    ("env", "options", "task_index"),
    [("babyai", {"levels": ["GoToRedBall"]}, 0), ("textcraft", {}, 3), ("search", {}, 0)],
)
def test_the_oracle_written_as_calls_wins_and_the_ids_are_the_rendered_conversation(
    tool_chat, env, options, task_index, tmp_path
):
    if env == "search":
        options = {"cache_dir": str(tmp_path)}
    host = EnvHost(env, options)
    replies = []

    def oracle(prompt, turn):
        replies.append(FMT.call_text(None, [host.oracle_call()]))
        return reply_ids(tool_chat, replies[-1])

    task_id = host.tasks("train")[task_index]
    trajectory, results, tools = play(tool_chat, host, task_id, oracle)
    assert trajectory.success and trajectory.done and not trajectory.truncated
    assert trajectory.actions == [action for action, _ in results]
    # The conversation in OpenAI's form: each reply a call, each observation that call's result.
    reset = EnvHost(env, options).reset(task_id)
    conversation = [{"role": "system", "content": host.tool_instruction()}, {"role": "user", "content": reset.text}]
    for turn, ((start, end), reply) in enumerate(zip(trajectory.turn_spans, replies, strict=True)):
        assert trajectory.token_ids[:start] == tool_chat.prompt_ids(conversation, tools.functions), turn
        assert trajectory.token_ids[start:end] == reply_ids(tool_chat, reply)
        call = FMT.parse(reply).calls[0]
        conversation += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call.id, "content": results[turn][1].observation},
        ]
    assert sum(trajectory.loss_mask) == sum(end - start for start, end in trajectory.turn_spans)
    # The record reads as plain text: the functions in the system prompt, results as user turns.
    assert trajectory.messages[0]["content"].startswith(host.tool_instruction())
    assert '"name": "' + tools.functions[0].name + '"' in trajectory.messages[0]["content"]
    assert all("<tool_response>" in m["content"] for m in trajectory.messages[3::2])


def test_a_reply_without_a_valid_call_leaves_the_env_unstepped_and_says_why(tool_chat):
    host = EnvHost("babyai", {"levels": ["GoToRedBall"]})
    bad = ToolCall(id="x", name="go_to", arguments={"object": "the ball"})
    scripted = {
        0: "I will look around first.",
        1: '<tool_call>\n{"name": "turn_left", "arguments": {</tool_call>',
        2: FMT.call_text("Going.", [bad]),
    }

    def policy(prompt, turn):
        index = len(played)
        played.append(index)
        if index in scripted:
            return reply_ids(tool_chat, scripted[index])
        calls = [host.oracle_call(), ToolCall(id="y", name="turn_right")]  # a parallel call: only the first runs
        return reply_ids(tool_chat, FMT.call_text(None, calls))

    played: list[int] = []  # the turns replied to so far
    task_id = host.tasks("train")[0]
    trajectory, results, _ = play(tool_chat, host, task_id, policy, horizon=5)
    assert trajectory.actions[:3] == ["", "", ""] and trajectory.step_rewards[:3] == [0.0] * 3
    first_key = trajectory.state_keys[0]
    assert trajectory.state_keys[:4] == [first_key] * 4  # nothing moved before the first executed call
    users = [m["content"] for m in trajectory.messages if m["role"] == "user"]
    assert users[1].startswith("Your reply made no function call. Act by calling one of the functions (turn_left,")
    assert users[2].startswith("Your function call could not be read: tool call 1 is not JSON")
    assert "arguments of go_to at object: 'the ball' does not match" in users[3]
    assert users[3].startswith("<tool_response>\n")  # a refused call is still answered as a call
    assert trajectory.actions[3].startswith("Action: ")
    assert f"<tool_response>\n{NOT_EXECUTED}\n</tool_response>" in users[4]
    assert isinstance(results[0], InvalidAction) and results[1][1].info["action_valid"]


def test_tiny_random_replies_are_kept_as_sampled_and_never_step_the_env(tool_chat, tokenizer):
    engine = tiny_engine(tokenizer)
    host = EnvHost("textcraft", {})
    returned = []

    def sample(prompt, turn):
        returned.append(engine.generate([prompt], SamplingConfig(max_new_tokens=12))[0].token_ids)
        return returned[-1]

    trajectory, results, _ = play(tool_chat, host, host.tasks("train")[0], sample, horizon=3)
    assert trajectory.num_turns == 3 and trajectory.truncation_reason == "horizon" and results == []
    for (start, end), ids in zip(trajectory.turn_spans, returned, strict=True):
        assert trajectory.token_ids[start:end] == ids
    assert trajectory.actions == ["", "", ""]
    assert [m["role"] for m in trajectory.messages] == ["system", "user"] + ["assistant", "user"] * 3

"""The Anthropic Messages API and OpenAI's Responses API on the policy endpoint, over real HTTP on 127.0.0.1 with the
official anthropic and openai clients.

The replica serves tiny-random's tokenizer with the scripted engine (tests/integration/scripted_serving.py): it
writes the text a user turn (or a tool result) quotes, continuing from the endpoint's forced call prefix or the
client's prefill where there is one, so each reply is a chosen call, text, or text cut by a stop sequence.
"""

from __future__ import annotations

import functools
import json

import anthropic
import httpx
import openai
import pytest
import ray

from agentgym_rl.actors.chat import ChatFormat
from agentgym_rl.actors.engines import EngineSpec
from agentgym_rl.actors.model_store import TINY_RANDOM, load_tokenizer
from agentgym_rl.actors.tool_formats import ToolChat, tool_format
from agentgym_rl.actors.weight_sync import free_port
from agentgym_rl.configs.schema import EpisodesConfig, ServeConfig
from agentgym_rl.envs.tools import Function
from agentgym_rl.serve.app import APP_NAME, ServeArgs, start_server, stop_server
from agentgym_rl.serve.deployment import STORE_NAMESPACE, episodes_name
from tests.integration.scripted_serving import ScriptedServing, script

KEY = "messages-key"
ENGINE = "tests.integration.scripted_serving:ScriptedServingEngine"
MAX_TOKENS = 64
MOVE = {
    "name": "move",
    "description": "Move in a direction.",
    "input_schema": {
        "type": "object",
        "properties": {"direction": {"type": "string", "enum": ["left", "right"]}, "steps": {"type": "integer"}},
        "required": ["direction"],
    },
}
LOOK = {"name": "look", "description": "Look around.", "input_schema": {"type": "object", "properties": {}}}
TOOLS = [MOVE, LOOK]
MOVE_LEFT = '<tool_call>\n{"name": "move", "arguments": {"direction": "left", "steps": 2}}\n</tool_call>'
LOOK_CALL = '<tool_call>\n{"name": "look", "arguments": {}}\n</tool_call>'
SYSTEM = "You move a robot."
NOTE = "Keep going."
post = functools.partial(httpx.post, timeout=120)


@pytest.fixture(scope="module")
def server(ray_local):
    port = free_port()
    limits = ServeConfig(
        port=port,
        api_key=KEY,
        engine=ENGINE,
        max_tokens=MAX_TOKENS,
        max_prompt_tokens=1024,
        episodes=EpisodesConfig(reward_range=(0.0, 1.0)),
    )
    start_server(ServeArgs(model=TINY_RANDOM, model_id="policy", serve=limits))
    yield f"http://127.0.0.1:{port}"
    stop_server()


@pytest.fixture(scope="module")
def client(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server, api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def openai_client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0)


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": script(text)}]


def blocks(message) -> list[tuple]:
    """A message's content, ids aside: ("text", text) and ("tool_use", name, input)."""
    return [(b.type, b.text) if b.type == "text" else (b.type, b.name, b.input) for b in message.content]


def test_a_reply_that_calls_a_tool_is_a_tool_use_block_and_the_sdks_stream_helper_reassembles_it(client):
    request = {"model": "policy", "max_tokens": MAX_TOKENS, "system": SYSTEM, "tools": TOOLS}
    message = client.messages.create(**request, messages=ask(f"Moving now.\n{MOVE_LEFT}"))
    assert message.stop_reason == "tool_use" and message.stop_sequence is None
    assert blocks(message) == [("text", "Moving now."), ("tool_use", "move", {"direction": "left", "steps": 2})]
    call = message.content[1]
    assert call.id.startswith("toolu_") and len(call.id) == len("toolu_") + 24
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0

    with client.messages.stream(**request, messages=ask(f"Moving now.\n{MOVE_LEFT}")) as stream:
        texts = list(stream.text_stream)
        streamed = stream.get_final_message()
    assert "".join(texts) == "Moving now."
    assert blocks(streamed) == blocks(message) and streamed.stop_reason == "tool_use"
    assert streamed.usage.output_tokens == message.usage.output_tokens

    # `any` and a named tool start the reply with the call (the script writes the rest); `none` returns the text.
    for choice in ({"type": "any"}, {"type": "tool", "name": "move"}):
        forced = client.messages.create(**request, messages=ask(MOVE_LEFT), tool_choice=choice)
        assert blocks(forced) == [("tool_use", "move", {"direction": "left", "steps": 2})], choice
    text = client.messages.create(**request, messages=ask(MOVE_LEFT), tool_choice={"type": "none"})
    assert blocks(text) == [("text", MOVE_LEFT)] and text.stop_reason == "end_turn"
    two = client.messages.create(**request, messages=ask(f"{LOOK_CALL}\n{MOVE_LEFT}"))
    assert [b[1] for b in blocks(two)] == ["look", "move"]
    one = client.messages.create(
        **request,
        messages=ask(f"{LOOK_CALL}\n{MOVE_LEFT}"),
        tool_choice={"type": "auto", "disable_parallel_tool_use": True},
    )
    assert [b[1] for b in blocks(one)] == ["look"]


def test_tool_result_turns_are_answered_and_a_result_for_no_call_is_refused(client):
    request = {"model": "policy", "max_tokens": MAX_TOKENS, "system": SYSTEM, "tools": TOOLS}
    first = client.messages.create(**request, messages=ask(MOVE_LEFT))
    [call] = first.content
    history = [
        *ask(MOVE_LEFT),
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
    ]
    result = {"type": "tool_result", "tool_use_id": call.id, "content": [{"type": "text", "text": script("Moved.")}]}
    second = client.messages.create(**request, messages=[*history, {"role": "user", "content": [result]}])
    assert blocks(second) == [("text", "Moved.")] and second.stop_reason == "end_turn"

    stranger = {**result, "tool_use_id": "toolu_000000000000000000000000"}
    with pytest.raises(anthropic.BadRequestError, match="answers tool call 'toolu_0+'") as info:
        client.messages.create(**request, messages=[*history, {"role": "user", "content": [stranger]}])
    assert info.value.body["error"]["type"] == "invalid_request_error"


def test_stop_sequences_max_tokens_and_a_prefill_end_the_reply_as_anthropics_api_does(client):
    request = {"model": "policy", "max_tokens": MAX_TOKENS}
    stopped = client.messages.create(**request, messages=ask("Hello there. STOP and more"), stop_sequences=["STOP"])
    assert blocks(stopped) == [("text", "Hello there. ")]
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", "STOP")
    with client.messages.stream(**request, messages=ask("Hello there. STOP and more"), stop_sequences=["STOP"]) as s:
        streamed = s.get_final_message()
    assert blocks(streamed) == blocks(stopped) and streamed.stop_sequence == "STOP"

    capped = client.messages.create(model="policy", max_tokens=2, messages=ask("one two three four five six"))
    assert capped.stop_reason == "max_tokens" and capped.usage.output_tokens == 2

    prefilled = [*ask("The answer is 42."), {"role": "assistant", "content": "The answer"}]
    continued = client.messages.create(**request, messages=prefilled)
    assert blocks(continued) == [("text", " is 42.")] and continued.stop_reason == "end_turn"


def test_bad_requests_get_anthropics_error_shape_and_status(server, client):
    good = {"model": "policy", "max_tokens": 8, "messages": ask("hi")}
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=server, api_key="wrong", max_retries=0).messages.create(**good)
    bearer = anthropic.Anthropic(base_url=server, auth_token=KEY, max_retries=0)
    assert blocks(bearer.messages.create(**good)) == [("text", "hi")]
    with pytest.raises(anthropic.NotFoundError, match="not served here"):
        client.messages.create(**{**good, "model": "claude-sonnet-4-5"})
    refused = {
        "max_tokens": {**good, "max_tokens": MAX_TOKENS + 1},
        "image": {
            **good,
            "messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "x"}}]}],
        },
        "tool_choice": {**good, "tool_choice": {"type": "any"}},
        "each tool needs its own name": {**good, "tools": [MOVE, MOVE]},
        "thinking": {**good, "thinking": {"type": "enabled", "budget_tokens": 1024}},
        "only client tools": {**good, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
        "temperature": {**good, "extra_body": {"temperature": 1.5}},
        "structured outputs": {**good, "output_config": {"format": {"type": "json_schema", "schema": {}}}},
    }
    for expected, body in refused.items():
        with pytest.raises(anthropic.BadRequestError, match=expected) as info:
            client.messages.create(**body)
        assert info.value.body["type"] == "error" and info.value.body["error"]["type"] == "invalid_request_error"
    raw = post(f"{server}/v1/messages", json={"model": "policy", "messages": ask("hi")}, headers={"x-api-key": KEY})
    assert raw.status_code == 400 and raw.json()["type"] == "error"
    assert "max_tokens" in raw.json()["error"]["message"] and set(raw.json()["error"]) == {"type", "message"}
    # the chat route keeps OpenAI's shape
    chat = post(f"{server}/v1/chat/completions", json={"model": "policy"}, headers={"x-api-key": KEY})
    assert chat.status_code == 400 and "param" in chat.json()["error"]


def assert_replayed(trajectory, functions: list[Function], turns: list[list[dict]]) -> None:
    """``trajectory`` (rewarded 1.0) is the replay: the opening (system, first user turn, tools) rendered once,
    then per call the scripted engine's reply to the ids so far, and after each reply but the last the next
    call's turn (``turns[i]``: its tool results, maybe a user message) appended as the turn's continuation;
    nothing is rendered twice."""
    tokenizer = load_tokenizer(TINY_RANDOM)
    tools = ToolChat(ChatFormat(tokenizer), tool_format("hermes"), "auto")
    engine = ScriptedServing(
        EngineSpec(
            model_name=TINY_RANDOM, dtype="float32", seed=0, stop_token_ids=[tokenizer.eos_token_id], pad_token_id=0
        ),
        max_requests=1,
    )
    opening = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": script(f"Moving.\n{MOVE_LEFT}")}]
    ids = tools.prompt_ids(opening, functions)
    spans = []
    for turn in range(len(turns) + 1):
        sampled = engine.reply_ids(ids)
        spans.append((len(ids), len(ids) + len(sampled)))
        ids = ids + sampled
        if turn < len(turns):
            ids = ids + tools.continuation_ids(sampled, turns[turn])
    assert trajectory.token_ids == ids
    assert trajectory.turn_spans == spans
    assert [i for i, m in enumerate(trajectory.loss_mask) if m] == [i for s, e in spans for i in range(s, e)]
    assert trajectory.reward == 1.0


def harvest() -> list:
    return ray.get(ray.get_actor(episodes_name(APP_NAME), namespace=STORE_NAMESPACE).harvest.remote())


def test_an_episode_played_through_the_messages_api_trains_on_exactly_the_ids_the_replica_sampled(server, client):
    opened = post(
        f"{server}/v1/episodes", json={"env": "babyai", "task_id": 3, "group": "messages"}, headers={"x-api-key": KEY}
    ).json()
    token = opened["token"]
    request = {"model": "policy", "max_tokens": MAX_TOKENS, "system": SYSTEM, "tools": TOOLS}
    messages = ask(f"Moving.\n{MOVE_LEFT}")
    results = [script(LOOK_CALL), script("A door.")]
    replies = []
    for turn in range(3):
        # the token rides in the header on the first two calls, in metadata on the last; the second call streams
        tagged = (
            {"extra_headers": {"X-Episode-Token": token}} if turn < 2 else {"metadata": {"user_id": f"episode:{token}"}}
        )
        if turn == 1:
            with client.messages.stream(**request, messages=messages, **tagged) as stream:
                reply = stream.get_final_message()
        else:
            reply = client.messages.create(**request, messages=messages, **tagged)
        replies.append(reply)
        messages = [
            *messages,
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]},
        ]
        if reply.stop_reason != "tool_use":
            break
        answers = [
            {"type": "tool_result", "tool_use_id": b.id, "content": results[turn]}
            for b in reply.content
            if b.type == "tool_use"
        ]
        # the second turn's results come with text in the same user turn, as Claude Code sends them
        messages.append({"role": "user", "content": answers + ([{"type": "text", "text": NOTE}] if turn == 1 else [])})
    assert [r.stop_reason for r in replies] == ["tool_use", "tool_use", "end_turn"]
    assert blocks(replies[2]) == [("text", "A door.")]
    closed = post(
        f"{server}/v1/episodes/{opened['id']}/reward",
        json={"reward": 1.0},
        headers={"x-api-key": KEY, "X-Episode-Token": token},
    ).json()
    assert closed["turns"] == 3 and closed["trainable"], closed

    [trajectory] = [t for g, t in harvest() if g == "messages"]
    functions = [Function(name=t["name"], description=t["description"], parameters=t["input_schema"]) for t in TOOLS]
    turns = [
        [
            {"role": "tool", "tool_call_id": b.id, "content": results[turn]}
            for b in reply.content
            if b.type == "tool_use"
        ]
        for turn, reply in enumerate(replies[:2])
    ]
    turns[1].append({"role": "user", "content": NOTE})
    assert_replayed(trajectory, functions, turns)


# ------------------------------------------------------------------------------------------- the Responses API

FUNCTIONS = [
    {"type": "function", "name": t["name"], "description": t["description"], "parameters": t["input_schema"]}
    for t in TOOLS
]


def items(response) -> list[tuple]:
    """A response's output, ids aside: ("message", text) and ("function_call", name, parsed arguments)."""
    return [
        ("message", "".join(part.text for part in item.content))
        if item.type == "message"
        else ("function_call", item.name, json.loads(item.arguments))
        for item in response.output
    ]


def test_a_response_that_calls_a_function_is_a_function_call_item_and_the_sdks_stream_helper_reassembles_it(
    openai_client,
):
    request = {"model": "policy", "instructions": SYSTEM, "tools": FUNCTIONS}
    response = openai_client.responses.create(**request, input=script(f"Moving now.\n{MOVE_LEFT}"))
    assert response.status == "completed" and response.id.startswith("resp_") and response.error is None
    assert items(response) == [("message", "Moving now."), ("function_call", "move", {"direction": "left", "steps": 2})]
    message, call = response.output
    assert message.id.startswith("msg_") and message.status == "completed" and response.output_text == "Moving now."
    assert call.id.startswith("fc_") and call.call_id.startswith("call_") and call.status == "completed"
    assert response.usage.input_tokens > 0 and response.usage.output_tokens > 0
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens
    assert [t.name for t in response.tools] == ["move", "look"] and response.tool_choice == "auto"

    with openai_client.responses.stream(**request, input=script(f"Moving now.\n{MOVE_LEFT}")) as stream:
        events = list(stream)
        streamed = stream.get_final_response()
    assert items(streamed) == items(response) and streamed.status == "completed"
    assert streamed.usage.output_tokens == response.usage.output_tokens
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Moving now."
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events if "delta" not in e.type] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    raw = list(openai_client.responses.create(**request, input=script(f"Moving now.\n{MOVE_LEFT}"), stream=True))
    assert raw[-1].type == "response.completed" and items(raw[-1].response) == items(response)

    # `required` and a named function start the reply with the call (the script writes the rest); `none` is text.
    for choice in ("required", {"type": "function", "name": "move"}):
        forced = openai_client.responses.create(**request, input=script(MOVE_LEFT), tool_choice=choice)
        assert items(forced) == [("function_call", "move", {"direction": "left", "steps": 2})], choice
    text = openai_client.responses.create(**request, input=script(MOVE_LEFT), tool_choice="none")
    assert items(text) == [("message", MOVE_LEFT)]
    two = openai_client.responses.create(**request, input=script(f"{LOOK_CALL}\n{MOVE_LEFT}"))
    assert [i[1] for i in items(two)] == ["look", "move"]
    one = openai_client.responses.create(
        **request, input=script(f"{LOOK_CALL}\n{MOVE_LEFT}"), parallel_tool_calls=False
    )
    assert [i[1] for i in items(one)] == ["look"] and one.parallel_tool_calls is False


def test_function_call_outputs_are_answered_and_an_output_for_no_call_is_refused(openai_client):
    request = {"model": "policy", "instructions": SYSTEM, "tools": FUNCTIONS}
    asked = [{"role": "user", "content": script(MOVE_LEFT)}]
    first = openai_client.responses.create(**request, input=asked)
    [call] = first.output
    # The output goes back as the SDK returned it, its models as they are; the result is a function_call_output.
    history = [*asked, *first.output]
    result = {"type": "function_call_output", "call_id": call.call_id, "output": script("Moved.")}
    second = openai_client.responses.create(**request, input=[*history, result])
    assert items(second) == [("message", "Moved.")] and second.status == "completed"
    parts = [{"type": "input_text", "text": "Moved"}, {"type": "input_text", "text": script("Done.")}]
    with_parts = openai_client.responses.create(**request, input=[*history, {**result, "output": parts}])
    assert items(with_parts) == [("message", "Done.")]

    stranger = {**result, "call_id": "call_000000000000000000000000"}
    with pytest.raises(openai.BadRequestError, match="answers call 'call_0+'") as info:
        openai_client.responses.create(**request, input=[*history, stranger])
    assert info.value.body["type"] == "invalid_request_error" and info.value.body["param"] == "input.2.call_id"


def test_the_token_cap_ends_a_response_incomplete_streamed_or_not(openai_client):
    request = {"model": "policy", "input": script("one two three four five six"), "max_output_tokens": 2}
    capped = openai_client.responses.create(**request)
    assert capped.status == "incomplete" and capped.incomplete_details.reason == "max_output_tokens"
    assert capped.usage.output_tokens == 2 and capped.output[0].status == "incomplete"
    events = list(openai_client.responses.create(**request, stream=True))
    assert events[-1].type == "response.incomplete" and items(events[-1].response) == items(capped)


def test_bad_responses_requests_get_openais_error_shape_and_status(server, openai_client):
    good = {"model": "policy", "input": "hi", "max_output_tokens": 8}
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server}/v1", api_key="wrong", max_retries=0).responses.create(**good)
    with pytest.raises(openai.NotFoundError, match="not served here") as info:
        openai_client.responses.create(**{**good, "model": "gpt-5"})
    assert info.value.body["code"] == "model_not_found"
    refused = {
        "previous_response_id": {**good, "previous_response_id": "resp_0123"},
        "stores no responses or conversations": {**good, "conversation": "conv_0123"},
        "tool_choice makes a call compulsory": {**good, "tool_choice": "required"},
        "not among `tools`": {**good, "tools": FUNCTIONS, "tool_choice": {"type": "function", "name": "fly"}},
        "only function tools": {**good, "tools": [{"type": "web_search"}]},
        "structured outputs": {**good, "text": {"format": {"type": "json_schema", "name": "x", "schema": {}}}},
        "reasoning is not served": {**good, "reasoning": {"effort": "high"}},
        "input_image": {**good, "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
        "item_reference": {**good, "input": [{"type": "item_reference", "id": "msg_0123"}]},
        "max_tokens cap": {**good, "max_output_tokens": MAX_TOKENS + 1},
        "each function in `tools` needs its own name": {**good, "tools": FUNCTIONS + FUNCTIONS[:1]},
        "unrecognized request argument supplied: background": {**good, "background": True},
        "answers call 'call_1'": {
            **good,
            "input": [
                {"role": "user", "content": "hi"},
                {"type": "function_call_output", "call_id": "call_1", "output": ""},
            ],
        },
    }
    for expected, body in refused.items():
        with pytest.raises(openai.BadRequestError, match=expected) as info:
            openai_client.responses.create(**body)
        error = info.value.body
        assert info.value.status_code == 400 and set(error) == {"message", "type", "param", "code"}, expected
        assert error["type"] == "invalid_request_error", expected


def test_an_episode_played_through_the_responses_api_trains_on_exactly_the_ids_the_replica_sampled(
    server, openai_client
):
    opened = post(
        f"{server}/v1/episodes", json={"env": "babyai", "task_id": 4, "group": "responses"}, headers={"x-api-key": KEY}
    ).json()
    token = opened["token"]
    request = {"model": "policy", "instructions": SYSTEM, "tools": FUNCTIONS, "max_output_tokens": MAX_TOKENS}
    conversation: list = [{"role": "user", "content": script(f"Moving.\n{MOVE_LEFT}")}]
    results = [script(LOOK_CALL), script("A door.")]
    replies = []
    for turn in range(3):
        # the token rides in the header on the first two calls, in `user` on the last; the second call streams
        tagged = {"extra_headers": {"X-Episode-Token": token}} if turn < 2 else {"user": f"episode:{token}"}
        if turn == 1:
            with openai_client.responses.stream(**request, input=conversation, **tagged) as stream:
                reply = stream.get_final_response()
        else:
            reply = openai_client.responses.create(**request, input=conversation, **tagged)
        replies.append(reply)
        conversation = [*conversation, *reply.output]
        calls = [item for item in reply.output if item.type == "function_call"]
        if not calls:
            break
        conversation += [{"type": "function_call_output", "call_id": c.call_id, "output": results[turn]} for c in calls]
        if turn == 1:  # a user message after the results: the same turn of the prompt
            conversation.append({"role": "user", "content": NOTE})
    assert [[i[0] for i in items(r)] for r in replies] == [
        ["message", "function_call"],
        ["function_call"],
        ["message"],
    ]
    assert items(replies[2]) == [("message", "A door.")]
    closed = post(
        f"{server}/v1/episodes/{opened['id']}/reward",
        json={"reward": 1.0},
        headers={"x-api-key": KEY, "X-Episode-Token": token},
    ).json()
    assert closed["turns"] == 3 and closed["trainable"], closed

    [trajectory] = [t for g, t in harvest() if g == "responses"]
    functions = [Function(name=t["name"], description=t["description"], parameters=t["parameters"]) for t in FUNCTIONS]
    turns = [
        [
            {"role": "tool", "tool_call_id": item.call_id, "content": results[turn]}
            for item in reply.output
            if item.type == "function_call"
        ]
        for turn, reply in enumerate(replies[:2])
    ]
    turns[1].append({"role": "user", "content": NOTE})
    assert_replayed(trajectory, functions, turns)

"""Function calling on the policy endpoint, over real HTTP on 127.0.0.1 with the official openai client.

The replica serves tiny-random's tokenizer with the scripted engine (tests/integration/scripted_serving.py): it
writes the text a user message quotes, continuing from the endpoint's forced call prefix where there is one, so
each reply is a chosen well-formed call, parallel calls, malformed JSON or text. One test serves tiny-random's
own weights (a side app), whose random text after the forced prefix may or may not parse: both are handled.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from ray import serve as ray_serve

from agentgym_rl.actors.model_store import TINY_RANDOM
from agentgym_rl.actors.weight_sync import free_port
from agentgym_rl.configs.schema import ServeConfig
from agentgym_rl.serve.app import ServeArgs, build_app, delete_app, start_server, stop_server
from tests.integration.scripted_serving import script

KEY = "tools-key"
ENGINE = "tests.integration.scripted_serving:ScriptedServingEngine"
MOVE = {
    "type": "function",
    "function": {
        "name": "move",
        "description": "Move in a direction.",
        "parameters": {
            "type": "object",
            "properties": {"direction": {"type": "string", "enum": ["left", "right"]}, "steps": {"type": "integer"}},
            "required": ["direction"],
        },
    },
}
LOOK = {"type": "function", "function": {"name": "look", "description": "Look around."}}
TOOLS = [MOVE, LOOK]
MOVE_LEFT = '<tool_call>\n{"name": "move", "arguments": {"direction": "left", "steps": 2}}\n</tool_call>'
LOOK_CALL = '<tool_call>\n{"name": "look", "arguments": {}}\n</tool_call>'
MALFORMED = '<tool_call>\n{"name": "move", "arguments": {"direction": }\n</tool_call>'


def ask(text: str) -> list[dict]:
    return [{"role": "system", "content": "You move a robot."}, {"role": "user", "content": script(text)}]


@pytest.fixture(scope="module")
def server(ray_local):
    port = free_port()
    limits = ServeConfig(port=port, api_key=KEY, engine=ENGINE, max_tokens=64, max_prompt_tokens=1024, max_n=2)
    start_server(ServeArgs(model=TINY_RANDOM, model_id="policy", serve=limits))
    yield f"http://127.0.0.1:{port}"
    stop_server()


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0)


def stats(url: str) -> dict[str, int]:
    return httpx.get(f"{url}/v1/policy", headers={"Authorization": f"Bearer {KEY}"}, timeout=60).json()["stats"]


def calls_of(message) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or ()]


def test_a_named_tool_choice_returns_that_functions_call_and_the_stream_reassembles_it(client):
    # The script writes only the arguments and the closing: the endpoint's forced prefix wrote the name.
    request = {
        "model": "policy",
        "messages": ask(MOVE_LEFT),
        "tools": TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "move"}},
        "seed": 3,
    }
    whole = client.chat.completions.create(**request)
    [choice] = whole.choices
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert calls_of(choice.message) == [("move", {"direction": "left", "steps": 2})]
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_") and len(call.id) == len("call_") + 24

    chunks = list(client.chat.completions.create(**request, stream=True))
    deltas = [c.choices[0].delta.tool_calls[0] for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert deltas[0].index == 0 and deltas[0].id.startswith("call_") and deltas[0].function.name == "move"
    assert all(d.id is None and d.function.name is None for d in deltas[1:]) and len(deltas) > 1
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert not any(c.choices[0].delta.content for c in chunks if c.choices)

    with client.chat.completions.stream(**request) as stream:
        streamed = stream.get_final_completion().choices[0]
    assert streamed.finish_reason == "tool_calls" and calls_of(streamed.message) == calls_of(choice.message)


def test_auto_reads_parallel_calls_and_the_text_around_them_and_parallel_false_keeps_the_first(client):
    reply = f"Looking first.\n{LOOK_CALL}\n{MOVE_LEFT}"
    request = {"model": "policy", "messages": ask(reply), "tools": TOOLS, "n": 2}
    whole = client.chat.completions.create(**request)
    for choice in whole.choices:
        assert choice.finish_reason == "tool_calls" and choice.message.content == "Looking first."
        assert calls_of(choice.message) == [("look", {}), ("move", {"direction": "left", "steps": 2})]
    ids = [call.id for choice in whole.choices for call in choice.message.tool_calls]
    assert len(set(ids)) == 4

    with client.chat.completions.stream(**{**request, "n": 1}) as stream:
        streamed = stream.get_final_completion().choices[0]
    assert streamed.message.content == "Looking first." and calls_of(streamed.message) == calls_of(choice.message)

    first = client.chat.completions.create(**request, parallel_tool_calls=False).choices[0]
    assert first.finish_reason == "tool_calls" and calls_of(first.message) == [("look", {})]


def test_tool_choice_none_and_requests_without_tools_return_the_text(client):
    for extra in ({"tools": TOOLS, "tool_choice": "none"}, {}):
        choice = client.chat.completions.create(model="policy", messages=ask(MOVE_LEFT), **extra).choices[0]
        assert choice.finish_reason == "stop" and choice.message.content == MOVE_LEFT
        assert choice.message.tool_calls is None


def test_required_starts_a_call_and_a_call_that_does_not_parse_is_text_and_counted(client, server):
    required = client.chat.completions.create(
        model="policy", messages=ask(LOOK_CALL), tools=TOOLS, tool_choice="required"
    ).choices[0]
    assert required.finish_reason == "tool_calls" and calls_of(required.message) == [("look", {})]

    before = stats(server)["unparsed_tool_calls"]
    whole = client.chat.completions.create(model="policy", messages=ask(MALFORMED), tools=TOOLS).choices[0]
    assert whole.finish_reason == "stop" and whole.message.content == MALFORMED and whole.message.tool_calls is None
    chunks = list(client.chat.completions.create(model="policy", messages=ask(MALFORMED), tools=TOOLS, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == MALFORMED
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert stats(server)["unparsed_tool_calls"] == before + 2


def test_tool_results_and_text_parts_are_accepted_and_reach_the_prompt(client):
    # The scripted engine writes what the last quoted text says: here the tool's result, then a text part.
    turn = client.chat.completions.create(model="policy", messages=ask(MOVE_LEFT), tools=TOOLS).choices[0]
    history = [
        {"role": "system", "content": [{"type": "text", "text": "You move"}, {"type": "text", "text": "a robot."}]},
        {"role": "user", "content": [{"type": "text", "text": "Go left."}]},
        turn.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": turn.message.tool_calls[0].id, "content": script("I moved.")},
    ]
    answer = client.chat.completions.create(model="policy", messages=history, tools=TOOLS).choices[0]
    assert answer.finish_reason == "stop" and answer.message.content == "I moved."
    history += [
        answer.message.model_dump(exclude_none=True),
        {"role": "user", "content": [{"type": "text", "text": "Now:"}, {"type": "text", "text": script("done")}]},
    ]
    assert client.chat.completions.create(model="policy", messages=history).choices[0].message.content == "done"


ASSISTANT_CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "look", "arguments": "{}"}}],
}


@pytest.mark.parametrize(
    ("change", "param", "words"),
    [
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]}, None, "type 'object'"),
        ({"tool_choice": "required"}, "tool_choice", "no `tools`"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "jump"}}}, "tool_choice.function.name", "'jump'"),
        ({"messages": [{"role": "user", "content": "hi"}, ASSISTANT_CALL, {"role": "tool", "tool_call_id": "call_2", "content": "x"}]}, "messages.2.tool_call_id", "'call_2'"),
        ({"messages": [{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "call_1", "content": "x"}]}, "messages.1.tool_call_id", "made none"),
        ({"messages": [{"role": "user", "content": "hi"}, {**ASSISTANT_CALL, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "look", "arguments": "[1]"}}]}]}, "messages.1.assistant.tool_calls.0.function.arguments", "JSON object"),
        ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None}]}, "messages.1.assistant", "`content` or `tool_calls`"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages.0.user.content", "only text content parts"),
        ({"tools": [{"type": "function", "function": {"name": "f"}, "cache": True}]}, "tools.0.cache", "unrecognized"),
        ({"tools": [*TOOLS, TOOLS[0]]}, "tools", "repeated: " + TOOLS[0]["function"]["name"]),
    ],
    ids=["schema-not-object", "required-without-tools", "unknown-named-tool", "unknown-call-id", "tool-without-call", "arguments-not-object", "empty-assistant", "image-part", "unknown-tool-field", "repeated-function-name"],
)  # fmt: skip
def test_each_bad_request_is_a_400_in_openais_shape_naming_the_field(client, change, param, words):
    request = {"model": "policy", "messages": [{"role": "user", "content": "hi"}], **change}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(**request)
    error = info.value.body
    assert info.value.status_code == 400 and set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and words in error["message"], error
    if param is not None:
        assert error["param"] == param, error


@pytest.mark.slow  # a second replica loads tiny-random's weights: about 30 s on a loaded 2-core machine
def test_a_real_models_text_after_the_forced_prefix_is_a_call_or_counted_text(server):
    """tiny-random's weights write random text after ``<tool_call>\\n{"name": "move", "arguments": ``: it parses as
    a call of ``move`` (finish ``tool_calls``) or comes back as that text (counted), never anything else."""
    args = ServeArgs(
        model=TINY_RANDOM, model_id="policy", app_name="real", serve=ServeConfig(api_key=KEY, max_tokens=8)
    )
    ray_serve.run(build_app(args), name="real", route_prefix="/real")
    ray_serve.get_deployment_handle("PolicyModel", app_name="real").ready.remote().result(timeout_s=900)
    try:
        real = openai.OpenAI(base_url=f"{server}/real/v1", api_key=KEY, max_retries=0)
        named = {"type": "function", "function": {"name": "move"}}
        before = stats(f"{server}/real")
        replies = [
            real.chat.completions.create(
                model="policy", messages=ask("go"), tools=TOOLS, tool_choice=named, seed=seed, max_tokens=8
            ).choices[0]
            for seed in range(4)
        ]
        after = stats(f"{server}/real")
    finally:
        delete_app("real")
    for reply in replies:
        if reply.finish_reason == "tool_calls":
            assert [c.function.name for c in reply.message.tool_calls] == ["move"]
        else:
            assert reply.message.content.startswith('<tool_call>\n{"name": "move", "arguments": ')
    parsed = sum(r.finish_reason == "tool_calls" for r in replies)
    assert after["tool_calls"] - before["tool_calls"] == parsed
    assert after["unparsed_tool_calls"] - before["unparsed_tool_calls"] == len(replies) - parsed

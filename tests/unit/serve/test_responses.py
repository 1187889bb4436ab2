"""The Responses API's request side: its input items read as the shared message form, the fields and values it
refuses (each with a message naming it), its request schema agreeing with the server, and its event stream."""

from __future__ import annotations

import asyncio
import json

import jsonschema
import pydantic
import pytest

from agentgym_rl.actors.engines import ChoiceDelta, CompletionRequest, SamplingParams
from agentgym_rl.configs.schema import ServeConfig
from agentgym_rl.envs.tools import ToolCall
from agentgym_rl.serve.errors import APIError
from agentgym_rl.serve.policy_api import PolicyAPI
from agentgym_rl.serve.responses_api import ResponsesAPI, conversation
from agentgym_rl.serve.responses_bodies import ResponsesRequest
from agentgym_rl.serve.routes import build_api
from agentgym_rl.serve.tool_replies import NO_TOOLS, ToolUse

LIMITS = ServeConfig(max_tokens=64)
MOVE = {"type": "function", "name": "move", "parameters": {"type": "object", "properties": {}}}
CALL = {"type": "function_call", "call_id": "call_1", "name": "move", "arguments": '{"steps": 2}'}
LOOK = {"type": "function_call", "call_id": "call_2", "name": "look", "arguments": "{}"}


def output(call_id: str, text: str = "ok") -> dict:
    return {"type": "function_call_output", "call_id": call_id, "output": text}


def read(**fields) -> list[dict]:
    return conversation(ResponsesRequest.model_validate({"model": "policy", **fields}))


async def _never() -> bool:
    return False


@pytest.fixture(scope="module")
def api() -> PolicyAPI:
    return PolicyAPI(None, model_id="policy", source="tiny-random", limits=LIMITS, model_ready=_never)


def test_text_input_is_a_user_message_after_the_instructions():
    assert read(input="hi", instructions="Be brief.") == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]


def test_messages_become_turns_with_developer_read_as_system_and_parts_joined():
    assert read(
        input=[
            {"role": "developer", "content": "Rules."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
            {"role": "assistant", "content": [{"type": "output_text", "text": "c", "annotations": []}], "id": "msg_1", "status": "completed"},
            {"role": "user", "content": "d"},
        ]
    ) == [
        {"role": "system", "content": "Rules."},
        {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": "c"},
        {"role": "user", "content": "d"},
    ]  # fmt: skip


def test_function_calls_join_the_assistant_message_before_them_and_outputs_answer_them():
    messages = read(
        input=[
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": "Looking, then moving."},
            LOOK,
            CALL,
            output("call_2", "a wall"),
            output("call_1", [{"type": "input_text", "text": "moved"}, {"type": "input_text", "text": "2 steps"}]),
            {**CALL, "call_id": "call_3"},  # after the outputs: the next reply, which only made a call
            output("call_3"),
            {"role": "user", "content": "and now?"},
        ]
    )
    assert messages == [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": "Looking, then moving.",
            "tool_calls": [ToolCall(id="call_2", name="look"), ToolCall(id="call_1", name="move", arguments={"steps": 2})],
        },
        {"role": "tool", "tool_call_id": "call_2", "content": "a wall"},
        {"role": "tool", "tool_call_id": "call_1", "content": "moved\n2 steps"},
        {"role": "assistant", "content": None, "tool_calls": [ToolCall(id="call_3", name="move", arguments={"steps": 2})]},
        {"role": "tool", "tool_call_id": "call_3", "content": "ok"},
        {"role": "user", "content": "and now?"},
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("items", "where"),
    [
        ([{"role": "user", "content": "go"}, output("call_1")], 1),
        ([{"role": "user", "content": "go"}, CALL, {"role": "user", "content": "wait"}, output("call_1")], 3),
        ([CALL, output("call_1"), LOOK, output("call_1")], 3),
    ],
    ids=["no call made", "a message between", "an earlier reply's call"],
)
def test_an_output_that_answers_no_call_of_the_reply_before_it_is_a_400_naming_the_item(items, where):
    with pytest.raises(APIError, match=r"answers call 'call_1'") as info:
        read(input=items)
    assert info.value.status == 400 and info.value.param == f"input.{where}.call_id"


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"previous_response_id": "resp_1"}, "stateless"),
        ({"conversation": "conv_1"}, "stateless"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "stateless"),
        ({"input": [{"type": "reasoning", "id": "rs_1", "summary": []}]}, "no reasoning"),
        ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "no images, files"),
        ({"input": [{"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}]}, "or refusals"),
        ({"input": [{**CALL, "arguments": "[1]"}]}, "a JSON object"),
        ({"input": [{**CALL, "arguments": "{"}]}, "not JSON"),
        ({"input": []}, "at least 1 item"),
        ({"input": 3}, "input is text or a list of items"),
        ({"tools": [{"type": "file_search", "vector_store_ids": []}]}, "only function tools"),
        ({"tools": [MOVE, MOVE]}, "each function in `tools` needs its own name"),
        ({"tools": [{**MOVE, "parameters": {"type": "array"}}]}, "type 'object'"),
        ({"tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": []}}, "is not served"),
        ({"text": {"format": {"type": "json_object"}}}, "structured outputs"),
        ({"reasoning": {"effort": "low"}}, "reasoning is not served"),
        ({"reasoning": {"summary": "auto"}}, "reasoning is not served"),
        ({"include": ["reasoning.encrypted_content"]}, "send an empty list"),
        ({"max_output_tokens": 0}, "greater than or equal to 1"),
        ({"temperature": "1"}, "valid number"),
        ({"background": True}, "Extra inputs are not permitted"),
    ],
)
def test_what_is_not_served_is_refused_with_a_message_naming_it(fields, says):
    with pytest.raises(pydantic.ValidationError, match=says):
        ResponsesRequest.model_validate({"model": "policy", "input": "hi", **fields})


def test_what_clients_send_by_default_is_accepted():
    # OpenAI's Agents SDK sends `include: []` and `tools: []`; its turns send the SDK's output items back as they are.
    body = ResponsesRequest.model_validate(
        {
            "model": "policy",
            "input": [{"role": "user", "content": "hi"}, {**CALL, "id": "fc_1", "status": "completed"}],
            "include": [],
            "tools": [],
            "store": False,
            "text": {"format": {"type": "text"}, "verbosity": "low"},
            "reasoning": {"effort": "none"},
            "metadata": {"run": "7"},
            "previous_response_id": None,
        }
    )
    assert body.include == [] and body.tools == []


def test_tool_choice_makes_the_reply_start_with_the_call_and_needs_tools(api):
    responses = ResponsesAPI(api)

    def use(**fields) -> ToolUse:
        return responses.tool_use(ResponsesRequest.model_validate({"model": "policy", "input": "hi", **fields}))

    assert use() == NO_TOOLS
    assert use(tools=[MOVE]).parse and use(tools=[MOVE]).prefix == ""
    assert not use(tools=[MOVE], tool_choice="none").parse
    assert use(tools=[MOVE], tool_choice="required").prefix == "<tool_call>"
    assert use(tools=[MOVE], tool_choice={"type": "function", "name": "move"}).prefix.endswith(
        '"name": "move", "arguments": '
    )
    assert not use(tools=[MOVE], parallel_tool_calls=False).parallel
    with pytest.raises(APIError, match="offers no `tools`"):
        use(tool_choice="required")
    with pytest.raises(APIError, match="not among `tools` \\(move\\)") as info:
        use(tools=[MOVE], tool_choice={"type": "function", "name": "fly"})
    assert info.value.param == "tool_choice.name"


@pytest.fixture(scope="module")
def schemas(api) -> dict:
    return build_api(api).openapi()["components"]["schemas"]


def accepted_by_schema(schemas: dict, body: dict) -> bool:
    validator = jsonschema.Draft202012Validator({**schemas["ResponsesRequest"], "components": {"schemas": schemas}})
    return validator.is_valid(body)


def accepted_by_server(body: dict) -> bool:
    """Whether the body validates, and the routes' caps and compulsory calls allow it (400 otherwise)."""
    try:
        request = ResponsesRequest.model_validate(body)
    except pydantic.ValidationError:
        return False
    compulsory = request.tool_choice not in (None, "none", "auto")
    return (request.max_output_tokens or 0) <= LIMITS.max_tokens and not (compulsory and not request.tools)


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"input": [{"role": "user", "content": "hi"}]},
        {"input": [{"type": "message", "role": "system", "content": [{"type": "input_text", "text": "x"}]}]},
        {"input": [{"role": "tool", "content": "hi"}]},
        {"input": [{"type": "message", "content": "hi"}]},
        {"input": [{"role": "user", "content": "hi", "type": None}]},
        {"input": [{"role": "assistant", "content": [{"type": "output_text", "text": "x", "annotations": []}]}]},
        {"input": [{"role": "user", "content": [{"type": "output_text", "text": "x"}]}]},
        {"input": [CALL, output("call_1")]},
        {"input": [{**CALL, "status": "done"}]},
        {"input": [{k: v for k, v in CALL.items() if k != "call_id"}]},
        {"input": [{"type": "reasoning", "summary": []}]},
        {"input": []},
        {"max_output_tokens": 64},
        {"max_output_tokens": 65},
        {"max_output_tokens": 0},
        {"tools": [MOVE]},
        {"tools": [MOVE], "tool_choice": "required"},
        {"tools": [MOVE], "tool_choice": {"type": "function", "name": "move"}},
        {"tool_choice": "required"},
        {"tools": [], "tool_choice": {"type": "function", "name": "move"}},
        {"tool_choice": "none"},
        {"tools": [{"type": "web_search"}]},
        {"tools": [{**MOVE, "strict": True, "description": None}]},
        {"previous_response_id": None, "conversation": None},
        {"previous_response_id": "resp_1"},
        {"text": {"format": {"type": "text"}}},
        {"text": {"format": {"type": "json_schema", "name": "x", "schema": {}}}},
        {"reasoning": {"effort": "none", "summary": None}},
        {"reasoning": {"effort": "medium"}},
        {"include": []},
        {"include": ["message.output_text.logprobs"]},
        {"metadata": {"a": "b"}},
        {"metadata": {"a": 1}},
        {"user": "someone", "seed": 3, "store": True, "stream": False},
        {"temperature": 2.5},
        {"top_p": 0},
    ],
)  # fmt: skip
def test_a_responses_body_passes_the_schema_exactly_when_the_server_takes_it(schemas, extra):
    body = {"model": "policy", "input": "hi", **extra}
    assert accepted_by_schema(schemas, body) == accepted_by_server(body), extra


def test_the_schema_names_the_served_model_and_the_token_cap(schemas):
    declared = schemas["ResponsesRequest"]["properties"]
    assert declared["model"]["enum"] == ["policy"]
    assert declared["max_output_tokens"]["anyOf"][0]["maximum"] == LIMITS.max_tokens


async def _deltas(text_ids: list[int], stop_id: int, *, fail: bool = False):
    ids = [*text_ids, stop_id]
    for at in range(0, len(ids), 2):
        piece = tuple(ids[at : at + 2])
        if fail and at >= 2:
            raise RuntimeError("the engine fell over")
        yield [ChoiceDelta(0, piece, (0.0,) * len(piece), finish_reason="stop" if at + 2 >= len(ids) else None)]


def stream_events(api: PolicyAPI, text: str, tools: list[dict], *, fail: bool = False) -> list[tuple[str, dict]]:
    """The events of a streamed response to ``text`` sampled in pieces of two tokens: (event name, data)."""
    responses = ResponsesAPI(api)
    body = ResponsesRequest.model_validate({"model": "policy", "input": "hi", "tools": tools, "stream": True})
    request = CompletionRequest(prompt_ids=[1, 2, 3], params=SamplingParams(max_new_tokens=64))
    ids = api.chat.tokenizer.encode(text, add_special_tokens=False)
    stream = _deltas(ids, api.chat.tokenizer.eos_token_id, fail=fail)

    async def collect() -> list[str]:
        return [sent async for sent in responses.events(body, request, 4, stream, responses.tool_use(body), None)]

    events = []
    for sent in asyncio.run(collect()):
        name, data = sent.removesuffix("\n\n").split("\n")
        events.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return events


def test_a_streamed_response_sends_its_items_in_order_with_sequence_numbers(api):
    call = '<tool_call>\n{"name": "move", "arguments": {}}\n</tool_call>'
    events = stream_events(api, f"On my way.\n{call}", [MOVE])
    assert all(name == data["type"] for name, data in events)
    assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
    names = [name for name, _ in events]
    assert names[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert names[-8:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    text = "".join(data["delta"] for name, data in events if name == "response.output_text.delta")
    final = events[-1][1]["response"]
    assert final["status"] == "completed" and final["weights_version"] == 4
    message, made = final["output"]
    assert text == message["content"][0]["text"] == "On my way."
    assert (made["name"], made["arguments"]) == ("move", "{}")
    added = [data["item"] for name, data in events if name == "response.output_item.added"]
    assert [item["id"] for item in added] == [message["id"], made["id"]] and added[1]["arguments"] == ""


def test_a_failure_after_the_status_was_sent_ends_the_stream_with_an_error_event(api):
    name, data = stream_events(api, "a longer reply than two tokens", [], fail=True)[-1]
    assert name == "error" and data["code"] == "internal_error"
    assert data["message"] == "generation failed: the engine fell over" and data["param"] is None

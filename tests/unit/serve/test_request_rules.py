"""The rules the endpoint's request schema states (caps, enums, the if/then rules between chat fields, the
reward's one-of) accept and refuse the same bodies the server does."""

from __future__ import annotations

import jsonschema
import pydantic
import pytest

from agentgym_rl.configs.schema import ServeConfig
from agentgym_rl.serve.bodies import ChatCompletionRequest, EpisodeReward
from agentgym_rl.serve.policy_api import PolicyAPI
from agentgym_rl.serve.routes import build_api

LIMITS = ServeConfig(max_tokens=64, max_n=2)
MESSAGES = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "move", "parameters": {"type": "object", "properties": {}}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "move", "arguments": "{}"}}


async def _never() -> bool:
    return False


@pytest.fixture(scope="module")
def schemas() -> dict:
    api = PolicyAPI(None, model_id="policy", source="tiny-random", limits=LIMITS, model_ready=_never)
    return build_api(api).openapi()["components"]["schemas"]


def accepted_by_schema(schemas: dict, name: str, body: dict) -> bool:
    validator = jsonschema.Draft202012Validator({**schemas[name], "components": {"schemas": schemas}})
    return validator.is_valid(body)


def accepted_by_server(model: type[pydantic.BaseModel], body: dict, limits: ServeConfig = LIMITS) -> bool:
    try:
        request = model.model_validate(body)
    except pydantic.ValidationError:
        return False
    if isinstance(request, ChatCompletionRequest):  # the caps the routes check (400 beyond), and tools to call
        compulsory = request.tool_choice not in (None, "none", "auto")
        return (
            (request.requested_tokens or 0) <= limits.max_tokens
            and (request.n or 1) <= limits.max_n
            and not (compulsory and not request.tools)
        )
    return True


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"max_tokens": 5},
        {"max_completion_tokens": 5},
        {"max_tokens": 5, "max_completion_tokens": 5},
        {"max_tokens": 5, "max_completion_tokens": None},
        {"max_tokens": 65},
        {"n": 2},
        {"n": 3},
        {"top_logprobs": 2},
        {"top_logprobs": 2, "logprobs": True},
        {"top_logprobs": 0},
        {"stream_options": {"include_usage": True}},
        {"stream_options": {"include_usage": True}, "stream": True},
        {"stream_options": None, "stream": False},
        {"stop": ""},
        {"stop": ["a", "b", "c", "d", "e"]},
        {"stop": ["a", "b"]},
        {"tools": [TOOL]},
        {"tools": [TOOL], "tool_choice": "required", "parallel_tool_calls": False},
        {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "move"}}},
        {"tool_choice": "required"},
        {"tool_choice": {"type": "function", "function": {"name": "move"}}},
        {"tools": [], "tool_choice": "required"},
        {"tool_choice": "none"},
        {"tools": [{"type": "function", "function": {"name": "move", "parameters": {"type": "string"}}}]},
        {"tools": [{"type": "function", "function": {"name": "move", "parameters": {}}}]},
        {"tools": [{"type": "function", "function": {"name": "no spaces"}}]},
        {"tools": [{"type": "retrieval", "function": {"name": "move"}}]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        {"messages": [*MESSAGES, {"role": "assistant", "content": None, "tool_calls": [CALL]}]},
        {"messages": [*MESSAGES, {"role": "assistant", "tool_calls": [CALL]}, {"role": "tool", "tool_call_id": "call_1", "content": "ok"}]},
        {"messages": [*MESSAGES, {"role": "assistant", "content": None}]},
        {"messages": [*MESSAGES, {"role": "assistant", "content": None, "tool_calls": []}]},
        {"messages": [*MESSAGES, {"role": "assistant", "content": "ok", "tool_calls": []}]},
        {"messages": [*MESSAGES, {"role": "tool", "content": "ok"}]},
        {"messages": [{"role": "developer", "content": "hi"}]},
    ],
)  # fmt: skip
def test_a_chat_body_passes_the_schema_exactly_when_the_server_takes_it(schemas, extra):
    body = {"model": "policy", "messages": MESSAGES, **extra}
    assert accepted_by_schema(schemas, "ChatCompletionRequest", body) == accepted_by_server(
        ChatCompletionRequest, body
    ), extra


@pytest.mark.parametrize(
    "body",
    [
        {"reward": 1.0},
        {"rewards": [0.0, 1.0]},
        {"reward": 1.0, "rewards": [1.0]},
        {},
        {"reward": None, "rewards": [2.0]},
    ],
)
def test_a_reward_body_gives_one_reward_or_one_per_turn(schemas, body):
    one_of = (body.get("reward") is None) != (body.get("rewards") is None)
    assert accepted_by_schema(schemas, "EpisodeReward", body) == (one_of and accepted_by_server(EpisodeReward, body))


def test_the_schema_names_the_served_model_and_its_caps(schemas):
    chat = schemas["ChatCompletionRequest"]["properties"]
    assert chat["model"]["enum"] == ["policy"]
    assert {"type": "integer", "minimum": 1, "maximum": 64} == {
        k: v for k, v in chat["max_tokens"]["anyOf"][0].items() if k in ("type", "minimum", "maximum")
    }
    assert "babyai" in schemas["ActRequest"]["properties"]["env"]["enum"]


def test_the_schema_declares_function_calling_in_requests_and_replies(schemas):
    chat = schemas["ChatCompletionRequest"]["properties"]
    assert {"tools", "tool_choice", "parallel_tool_calls"} <= set(chat)
    mapping = chat["messages"]["items"]["discriminator"]["mapping"]
    assert set(mapping) == {"system", "developer", "user", "assistant", "tool"}
    for role, ref in mapping.items():  # each role's message schema admits that role
        declared = schemas[ref.rsplit("/", 1)[-1]]["properties"]["role"]
        assert role in declared.get("enum", [declared.get("const")]), role
    assert "tool_calls" in schemas["AssistantMessage"]["properties"]
    assert "tool_calls" in schemas["Choice"]["properties"]["finish_reason"]["enum"]

"""Both HTTP surfaces held to their OpenAPI schemas: Schemathesis with every check and every phase (examples,
coverage, fuzzing, and the stateful phase that follows the schemas' links: /create to the routes that take its
id, an opened episode to its calls and reward), over the env server in process (ASGI) and over the policy
endpoint on HTTP with a live replica, an API key and its episode book; then the cases fuzzing once found,
one by one.

Every route's body, every status it answers and the key it needs are declared, so each answer is held to
the schema: no 5xx, no status, header or body outside what is declared, no schema-violating request
accepted (a boolean or string where a number belongs), no schema-valid one refused, a 405 with `Allow`,
a keyed route refusing a request without the key. Schemathesis did not send the UTF-16 body issue 49
names (it reached the env server another way), so that case, like each one the issue lists, has a test
of its own below.

The chat schema declares function calling (issue 45): `tools`, `tool_choice`, `tool` messages, assistant
`tool_calls`, content as text parts, so the fuzzer sends them. Five of its rules relate values that JSON Schema
cannot relate: a `tool` message answers a call of the assistant message before it, a call's `arguments` string
holds a JSON object, a function's `parameters` is a valid JSON Schema, the `tools` have distinct names (JSON
Schema's `uniqueItems` compares whole items), a named `tool_choice` names one of the `tools`. A `before_call` hook (:func:`answerable`) makes each schema-valid body it sends keep them, decided by the
server's own body models; bodies generated to break the schema go as generated. Each rule's 400 is tested with
the openai client in tests/integration/test_serve_tools.py. The Anthropic Messages route has rules of the same kind
(a `tool_result` answers a `tool_use` of the turn before, a last assistant turn makes no call, valid and distinct
tools, a named `tool_choice` among them), kept the same way (:func:`messages_answerable`) and tested with the
anthropic client in tests/integration/test_serve_apis.py; so has the Responses API route (a `function_call_output`
answers a `function_call` of the reply before it, arguments hold a JSON object, valid and distinct functions, a named
`tool_choice` among them: :func:`responses_answerable`), tested with the openai client in the same file.
"""

from __future__ import annotations

import httpx
import pydantic
import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from schemathesis.core.parameters import ParameterLocation
from schemathesis.engine import events, from_schema
from schemathesis.hooks import GLOBAL_HOOK_DISPATCHER

from agentgym_rl.actors.model_store import TINY_RANDOM
from agentgym_rl.actors.weight_sync import free_port
from agentgym_rl.configs.schema import EpisodesConfig, ServeConfig
from agentgym_rl.envs.http import build_app
from agentgym_rl.serve.anthropic_bodies import CustomTool
from agentgym_rl.serve.app import ServeArgs, start_server, stop_server
from agentgym_rl.serve.bodies import FunctionCallBody, FunctionSpec
from agentgym_rl.serve.responses_bodies import FunctionCallItem, FunctionTool

KEY = "fuzz-key"
PHASES = ["examples", "coverage", "fuzzing", "stateful"]
# Examples per operation: 10 in the CI tier (env server 4-7 s, policy endpoint 15 s; enough to find every
# conformance failure issue 49 lists on the policy endpoint), 200 in the slow tier, as issue 49's run (env server
# 10-33 s, policy endpoint 52 s), on a loaded 2-core machine.
BUDGETS = [pytest.param(10, id="ci"), pytest.param(200, id="full", marks=pytest.mark.slow)]


def conformance_failures(schema: schemathesis.BaseSchema, examples: int, headers: dict | None = None) -> list[str]:
    """Run Schemathesis over ``schema`` as ``st run --checks all --phases examples,coverage,fuzzing,stateful
    --max-examples N --continue-on-failure`` does, derandomized; returns one line per failed check or error."""
    config = schema.config
    config.update(continue_on_failure=True, headers=headers)
    config.checks.update(included_check_names=["all"])
    # A body over serve.max_body_bytes is refused with 413 before it is read: a rejection too (a schema-violating
    # array longer than maxItems can be that big).
    config.checks.negative_data_rejection.expected_statuses.append("413")
    config.phases.update(phases=PHASES)
    config.generation.update(max_examples=examples, deterministic=True)
    failures, phases = [], []
    for event in from_schema(schema).execute():
        if isinstance(event, events.ScenarioFinished):
            for case_id, checks in event.recorder.checks.items():
                request, answer = event.recorder.cases[case_id].value, event.recorder.interactions.get(case_id)
                response = answer.response if answer is not None else None
                status = response.status_code if response is not None else None
                said = response.text[:300] if response is not None else ""
                failures += [
                    f"{event.recorder.label}: {check.name}: {check.failure_info.failure.title}: "
                    f"{check.failure_info.failure.message} (answered {status}, {said!r}, to body "
                    f"{request.body!r:.300}, headers {request.headers})"
                    for check in checks
                    if check.failure_info is not None
                ]
        elif isinstance(event, events.NonFatalError):
            failures.append(f"{event.label}: {event.info.message}")
        elif isinstance(event, events.FatalError):
            failures.append(f"fatal: {event.exception!r}")
        elif isinstance(event, events.PhaseFinished) and event.phase.is_enabled:
            phases.append(event.phase.name.value)
        elif isinstance(event, events.EngineFinished):
            failures += [f"after the run: {failure.title}: {failure.message}" for failure in event.failures]
    assert "stateful" in phases, f"the stateful phase did not run (ran: {phases}): are the schema's links declared?"
    return failures


# ----------------------------------------------------------------------------------------------- env server


def env_server(**server) -> FastAPI:
    return build_app("babyai", max_envs=8, **server)


@pytest.mark.parametrize("examples", BUDGETS)
def test_env_server_conforms_to_its_schema(examples):
    schema = schemathesis.openapi.from_asgi("/openapi.json", env_server(token=KEY))
    failures = conformance_failures(schema, examples, headers={"Authorization": f"Bearer {KEY}"})
    assert not failures, "\n".join(failures)


def test_every_env_server_route_declares_its_body_and_error_statuses():
    spec = env_server().openapi()
    for path, methods in spec["paths"].items():
        for method, operation in methods.items():
            statuses = set(operation["responses"])
            assert {"200", "400", "401", "422", "500"} <= statuses, f"{method} {path}: {sorted(statuses)}"
            if method == "post" and path != "/create":
                assert "requestBody" in operation, f"{method} {path} declares no body"


@pytest.fixture(scope="module")
def env_http():
    with TestClient(env_server(token=KEY), headers={"Authorization": f"Bearer {KEY}"}) as client:
        yield client


@pytest.mark.parametrize(
    "body",
    [
        '{"id": 0, "data_idx": 1}'.encode("utf-16"),  # UTF-16 with its byte order mark
        '{"id": 0, "data_idx": 1}'.encode("utf-32"),
        b'\xef\xbb\xbf{"id": 0, "data_idx": 1}',  # UTF-8 with a byte order mark (RFC 8259: not to be sent)
        b'{"id": 0, "data_idx": ',
        b"[" * 100_000,
    ],
    ids=["utf-16", "utf-32", "utf-8-bom", "truncated", "nested-too-deep"],
)
def test_env_server_answers_a_body_that_is_not_utf8_json_with_400(env_http, body):
    answer = env_http.post("/reset", content=body, headers={"content-type": "application/json"})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"].startswith("the body is not")


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("GET", "/create", {"POST"}),
        ("TRACE", "/step", {"POST"}),
        ("PUT", "/observation", {"GET"}),
        ("POST", "/", {"GET"}),
    ],
)
def test_env_server_405_names_the_methods_in_allow(env_http, method, path, allowed):
    answer = env_http.request(method, path)
    assert answer.status_code == 405 and set(answer.headers["allow"].split(", ")) == allowed
    assert answer.json()["error"].endswith(f"this route takes {answer.headers['allow']}")


def test_env_server_schema_and_docs_are_public_and_every_route_needs_the_token():
    client = TestClient(env_server(token=KEY))
    schema = client.get("/openapi.json")
    assert schema.status_code == 200 and schema.json()["security"] == [{"bearer": []}]
    assert client.get("/docs").status_code == 200
    assert client.get("/").status_code == 401
    assert client.post("/create").status_code == 401


# ---------------------------------------------------------------------------------------------- policy endpoint


@pytest.fixture(scope="module")
def endpoint(ray_local):
    """The policy endpoint served by Ray Serve on 127.0.0.1 with an API key: a live tiny-random replica and its
    episode book."""
    port = free_port()
    limits = ServeConfig(
        port=port,
        api_key=KEY,
        max_tokens=8,
        max_prompt_tokens=8192,
        max_body_bytes=65536,  # the Messages API's tool inputs are any JSON: generated bodies run to tens of KB
        max_n=2,
        episodes=EpisodesConfig(),
    )
    start_server(ServeArgs(model=TINY_RANDOM, dtype="float32", serve=limits))
    yield f"http://127.0.0.1:{port}"
    stop_server()


@pytest.fixture(scope="module")
def policy_http(endpoint):
    with httpx.Client(base_url=endpoint, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as client:
        yield client


CHAT = {"model": TINY_RANDOM, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", {**CHAT, "max_completion_tokens": True, "max_tokens": None}, "max_completion_tokens"),
        ("/v1/chat/completions", {**CHAT, "temperature": "0.5"}, "temperature"),
        ("/v1/chat/completions", {**CHAT, "seed": "7"}, "seed"),
        ("/v1/chat/completions", {**CHAT, "logprobs": 1}, "logprobs"),
        ("/v1/chat/completions", {**CHAT, "stream": True, "stream_options": {"include_usage": "FALSE"}}, None),
        ("/v1/act", {"env": "babyai", "observation": "hi", "temperature": "1"}, "temperature"),
        ("/v1/episodes", {"task_id": False}, "task_id"),
        ("/v1/episodes", {"task_id": "3"}, "task_id"),
    ],
)
def test_policy_endpoint_refuses_wrong_json_types(policy_http, path, body, param):
    answer = policy_http.post(path, json=body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "invalid_value"
    assert error["param"] == (param or "stream_options.include_usage")


def test_policy_endpoint_still_reads_a_json_integer_as_a_float(policy_http):
    answer = policy_http.post("/v1/chat/completions", json={**CHAT, "temperature": 0, "top_p": 1})
    assert answer.status_code == 200, answer.text
    opened = policy_http.post("/v1/episodes", json={"task_id": 3})
    assert opened.status_code == 201, opened.text
    episode = opened.json()
    closed = policy_http.post(
        f"/v1/episodes/{episode['id']}/reward", json={"reward": 1}, headers={"X-Episode-Token": episode["token"]}
    )
    assert closed.status_code == 200 and closed.json()["reward"] == 1.0, closed.text


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("TRACE", "/v1/models", {"GET"}),
        ("GET", "/v1/chat/completions", {"POST"}),
        ("DELETE", "/v1/act", {"POST"}),
        ("PUT", "/v1/episodes", {"POST"}),
        ("PATCH", "/healthz", {"GET"}),
    ],
)
def test_policy_endpoint_405_names_the_methods_in_allow(policy_http, method, path, allowed):
    answer = policy_http.request(method, path)
    assert answer.status_code == 405 and set(answer.headers["allow"].split(", ")) == allowed
    error = answer.json()["error"]
    assert error["code"] == "method_not_allowed" and error["message"].endswith(answer.headers["allow"])


def test_policy_schema_and_docs_are_public_and_every_v1_route_needs_the_key(endpoint):
    with httpx.Client(base_url=endpoint, timeout=60) as anonymous:
        schema = anonymous.get("/openapi.json")
        assert schema.status_code == 200
        assert anonymous.get("/docs").status_code == 200
        assert anonymous.get("/healthz").status_code == 200
        for path, operations in schema.json()["paths"].items():
            if path == "/healthz":
                assert "security" not in operations["get"]
                continue
            for method, operation in operations.items():
                assert operation["security"] == [{"bearer": []}], f"{method} {path}"
        assert anonymous.get("/v1/models").status_code == 401
        assert anonymous.post("/v1/chat/completions", json=CHAT).status_code == 401


def _valid(model: type[pydantic.BaseModel], value: object) -> bool:
    try:
        model.model_validate(value)
    except pydantic.ValidationError:
        return False
    return True


def answerable(context, case, **kwargs) -> None:
    """``before_call`` hook: a schema-valid chat body keeps the rules JSON Schema cannot state (module docstring).
    A tool message answering no call of the assistant message before it answers that message's first call, or
    becomes a user message when there is none; arguments that are no JSON object become ``{}``; parameters that
    are no valid object schema become ``{"type": "object"}``; a function named as one before it gets a numbered
    name; a named ``tool_choice`` names the first tool."""
    body = case.body
    path = case.operation.path
    if path not in ("/v1/chat/completions", "/v1/messages", "/v1/responses") or not isinstance(body, dict):
        return
    if case.meta is None or case.meta.is_negative_at(ParameterLocation.BODY):
        return
    if path == "/v1/responses":
        responses_answerable(body)
        return
    if not isinstance(body.get("messages"), list):
        return
    if path == "/v1/messages":
        messages_answerable(body)
        return
    calls: list[str] = []
    for index, message in enumerate(body["messages"]):
        if not isinstance(message, dict):
            continue
        if message.get("role") == "tool" and message.get("tool_call_id") not in calls:
            if calls:
                message["tool_call_id"] = calls[0]
            else:
                body["messages"][index] = {"role": "user", "content": message.get("content", "")}
        elif message.get("role") == "assistant":
            for call in message.get("tool_calls") or ():
                if isinstance(call, dict) and not _valid(FunctionCallBody, call.get("function")):
                    call["function"] = {**call.get("function", {}), "arguments": "{}"}
            calls = [call.get("id") for call in message.get("tool_calls") or () if isinstance(call, dict)]
        elif message.get("role") != "tool":
            calls = []
    tools = [tool["function"] for tool in body.get("tools") or () if isinstance(tool, dict) and "function" in tool]
    valid_and_distinct([f for f in tools if isinstance(f, dict)], FunctionSpec, "parameters")
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and tools and choice.get("function", {}).get("name") not in [f["name"] for f in tools]:
        choice["function"] = {"name": tools[0]["name"]}


def valid_and_distinct(specs: list[dict], model: type[pydantic.BaseModel], schema_field: str) -> None:
    """Each function or tool spec valid by ``model`` (else its ``schema_field`` becomes ``{"type": "object"}``) and
    named apart from those before it (else a numbered name)."""
    taken = {spec.get("name") for spec in specs}
    seen: set[str] = set()
    for spec in specs:
        if not _valid(model, spec):
            spec[schema_field] = {"type": "object"}
        if spec.get("name") in seen:
            spec["name"] = next(f"f{n}" for n in range(len(taken) + 1) if f"f{n}" not in taken)
            taken.add(spec["name"])
        seen.add(spec.get("name"))


def messages_answerable(body: dict) -> None:
    """The Messages API's rules JSON Schema cannot state, kept as :func:`answerable` keeps the chat route's: a
    ``tool_result`` answering no ``tool_use`` of the assistant turn before it answers that turn's first call, or
    becomes a text block when there is none; a last assistant turn keeps only its text (its calls would need
    results); an input schema that is no valid object schema becomes ``{"type": "object"}``; a tool named as one
    before it gets a numbered name; a named ``tool_choice`` names the first tool."""
    calls: list[str] = []
    turns = body["messages"]
    for turn in turns:
        content = turn.get("content") if isinstance(turn, dict) else None
        if not isinstance(content, list):
            calls = []
            continue
        if turn.get("role") == "assistant":
            calls = [b.get("id") for b in content if isinstance(b, dict) and b.get("type") == "tool_use"]
            continue
        for index, block in enumerate(content):
            if isinstance(block, dict) and block.get("type") == "tool_result" and block.get("tool_use_id") not in calls:
                if calls:
                    block["tool_use_id"] = calls[0]
                else:
                    content[index] = {"type": "text", "text": ""}
        calls = []
    last = turns[-1] if turns else None
    if isinstance(last, dict) and last.get("role") == "assistant" and isinstance(last.get("content"), list):
        last["content"] = [b for b in last["content"] if not (isinstance(b, dict) and b.get("type") == "tool_use")]
    tools = [tool for tool in body.get("tools") or () if isinstance(tool, dict)]
    valid_and_distinct(tools, CustomTool, "input_schema")
    choice = body.get("tool_choice")
    named = isinstance(choice, dict) and choice.get("type") == "tool"
    if named and tools and choice.get("name") not in [tool.get("name") for tool in tools]:
        choice["name"] = tools[0]["name"]


def responses_answerable(body: dict) -> None:
    """The Responses API's rules JSON Schema cannot state, kept as :func:`answerable` keeps the chat route's: a
    ``function_call_output`` answering no call of the reply before it (its run of ``function_call`` items, with the
    assistant message just before them) answers that reply's first call, or gets a ``function_call`` before it to
    answer when that reply made none; arguments that are no JSON object become ``{}``; a function whose parameters
    are no valid object schema gets ``{"type": "object"}``; a function named as one before it gets a numbered name;
    a named ``tool_choice`` names the first function."""
    items = body.get("input")
    if isinstance(items, list):
        kept: list = []
        calls: list[str] = []  # the calls of the reply the next output may answer
        last = None  # what the previous item adds to the conversation: an assistant message, a result, or other
        for item in items:
            kind = (item.get("type") or "message") if isinstance(item, dict) else None
            if kind == "function_call":
                if not _valid(FunctionCallItem, item):
                    item["arguments"] = "{}"
                calls = [*calls, item.get("call_id")] if last == "assistant" else [item.get("call_id")]
                last = "assistant"
            elif kind == "function_call_output":
                if item.get("call_id") not in calls and calls:
                    item["call_id"] = calls[0]
                elif item.get("call_id") not in calls:
                    kept.append(
                        {"type": "function_call", "call_id": item.get("call_id"), "name": "f", "arguments": "{}"}
                    )
                    calls = [item.get("call_id")]
                last = "result"
            elif kind == "message":
                calls, last = [], "assistant" if item.get("role") == "assistant" else "other"
            kept.append(item)
        items[:] = kept
    tools = [tool for tool in body.get("tools") or () if isinstance(tool, dict)]
    valid_and_distinct(tools, FunctionTool, "parameters")
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and tools and choice.get("name") not in [tool.get("name") for tool in tools]:
        choice["name"] = tools[0]["name"]


@pytest.fixture()
def tool_rules_kept():
    """:func:`answerable` as a global ``before_call`` hook (Schemathesis runs that hook only globally) for one
    test."""
    GLOBAL_HOOK_DISPATCHER.register_hook_with_name(answerable, "before_call")
    yield
    GLOBAL_HOOK_DISPATCHER.unregister(answerable)


@pytest.mark.usefixtures("tool_rules_kept")
@pytest.mark.parametrize("examples", BUDGETS)
def test_policy_endpoint_conforms_to_its_schema(endpoint, examples):
    # Last in the module: the fuzzer opens episodes up to the book's cap, after which opening one answers 429.
    # Loaded from the live server, without the key: the schema is public, as /docs is.
    schema = schemathesis.openapi.from_url(f"{endpoint}/openapi.json")
    failures = conformance_failures(schema, examples, headers={"Authorization": f"Bearer {KEY}"})
    assert not failures, "\n".join(failures)

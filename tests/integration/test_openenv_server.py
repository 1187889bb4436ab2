"""`agentgym-rl env-server ENV --protocol openenv`, played by the `openenv` package's own client.

openenv's ``GenericEnvClient`` (unmodified, given the server's http:// URL; it speaks the WebSocket session at
``/ws``) and plain HTTP (``POST /reset`` and ``/step`` naming the episode) play BabyAI and TextCraft to the end
with the env's oracle actions; every reward, done and observation equals what the env itself gives for the same
actions. BabyAI is served by the real CLI in a subprocess, with a bearer token; TextCraft and a BabyAI with
functions (tool calls) by the same app in this process, on real sockets.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import schemathesis
from openenv.core import GenericEnvClient
from openenv.core.client_types import StepResult
from schemathesis.engine import events, from_schema
from starlette.testclient import TestClient

from agentgym_rl.actors.weight_sync import free_port
from agentgym_rl.envs import Function, ToolCall, make, register
from agentgym_rl.envs.babyai import BabyAIEnv
from agentgym_rl.envs.openenv.server import build_openenv_app
from tests.integration.http_server import serve

TOKEN = "openenv-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CLI = Path(sys.executable).parent / "agentgym-rl"


class CallableBabyAI(BabyAIEnv):
    """BabyAI whose actions are one function, ``act(action)``, for the tool-call tests."""

    def functions(self) -> list[Function]:
        return [
            Function(
                name="act",
                description="Take one BabyAI action.",
                parameters={
                    "type": "object",
                    "properties": {"action": {"type": "string"}},
                    "required": ["action"],
                    "additionalProperties": False,
                },
            )
        ]

    def action_text(self, call: ToolCall) -> str:
        return f"Action: {call.arguments['action']}"


register("test-callable-babyai", f"{__name__}:CallableBabyAI")


@pytest.fixture(scope="module")
def babyai_url() -> Iterator[str]:
    """`agentgym-rl env-server babyai --protocol openenv --token ...` in a subprocess."""
    port = free_port()
    command = [str(CLI)] if CLI.exists() else [sys.executable, "-m", "agentgym_rl.driver.cli"]
    command += ["env-server", "babyai", "--protocol", "openenv", "--port", str(port), "--max-envs", "8"]
    env = {**os.environ, "AGENTGYM_ENV_TOKEN": TOKEN}
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None, f"the server exited: {process.stdout.read()}"
            assert time.monotonic() < deadline, "the server did not answer /health in 120 s"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", headers=AUTH, timeout=2).status_code == 200:
                    break
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def textcraft_url() -> Iterator[str]:
    with serve(build_openenv_app("textcraft", max_envs=4)) as url:
        yield url


@pytest.fixture(scope="module")
def callable_url() -> Iterator[str]:
    with serve(build_openenv_app("test-callable-babyai", max_envs=4)) as url:
        yield url


def session(url: str, headers: dict[str, str] | None = None):
    """openenv's generic client on the server's WebSocket session, synchronous."""
    return GenericEnvClient(base_url=url, headers=headers).sync()


def play(env_name: str, task_id: int, reset, step, move=lambda env, action: {"text": action}) -> list[dict[str, Any]]:
    """Play task ``task_id`` to its end with the oracle's actions through ``reset(task_id)`` and ``step(action)``
    (each returning a result as openenv's client parses it), checking every answer against the env's own.
    Returns the actions sent."""
    env = make(env_name.removeprefix("test-callable-"))
    first = env.reset(task_id)
    result = reset(task_id)
    assert (result.observation["text"], result.observation["task_id"]) == (first.text, task_id)
    assert result.reward is None and result.done is False
    sent = []
    while not result.done:
        action = env.oracle_action()
        expected = env.step(f"Action: {action}")
        sent.append(move(env, action))
        result = step(sent[-1])
        assert result.observation["text"] == expected.observation
        assert (result.reward, result.done) == (expected.reward, expected.done)
        assert result.observation["metadata"]["success"] == expected.info["success"]
        assert len(sent) <= 64, "the oracle should finish the task"
    assert expected.info["success"] and result.reward > 0
    return sent


class HTTPEpisode:
    """One episode over openenv's HTTP routes, named so each request continues it."""

    def __init__(self, url: str, name: str, headers: dict[str, str] | None = None) -> None:
        self.http = httpx.Client(base_url=url, headers=headers, timeout=30)
        self.name = name

    def reset(self, task_id: int):
        return self._result(self.http.post("/reset", json={"task_id": task_id, "episode_id": self.name}))

    def step(self, action: dict[str, Any]):
        return self._result(self.http.post("/step", json={"action": action, "episode_id": self.name}))

    @staticmethod
    def _result(response: httpx.Response):
        assert response.status_code == 200, response.text
        payload = response.json()
        return StepResult(observation=payload["observation"], reward=payload["reward"], done=payload["done"])


@pytest.mark.parametrize("transport", ["websocket", "http"])
def test_babyai_from_the_cli_matches_the_env(babyai_url, transport):
    if transport == "websocket":
        with session(babyai_url, AUTH) as client:
            play("babyai", 7, lambda task: client.reset(task_id=task), client.step)
            assert client.state()["done"] is True and client.state()["task_id"] == 7
    else:
        episode = HTTPEpisode(babyai_url, "babyai-7", AUTH)
        play("babyai", 7, episode.reset, episode.step)
        after = episode.http.post("/step", json={"action": {"text": "turn left"}, "episode_id": "babyai-7"})
        assert after.status_code == 409 and "'babyai-7' is over" in after.json()["detail"]


@pytest.mark.parametrize("transport", ["websocket", "http"])
def test_textcraft_matches_the_env(textcraft_url, transport):
    task = make("textcraft").tasks("test")[3]
    if transport == "websocket":
        with session(textcraft_url) as client:
            play("textcraft", task, lambda task_id: client.reset(task_id=task_id), client.step)
    else:
        episode = HTTPEpisode(textcraft_url, "textcraft-held-out")
        play("textcraft", task, episode.reset, episode.step)


def as_tool_call(env, action: str) -> dict[str, Any]:
    """The oracle's action as a call of one of the env's own functions."""
    call = env.call_of_action(action)
    assert call is not None, f"no function expresses {action!r}"
    return {"tool_call": {"name": call.name, "arguments": call.arguments}}


@pytest.mark.parametrize("env_name", ["babyai", "textcraft"])
def test_the_envs_functions_play_as_their_text(babyai_url, textcraft_url, env_name):
    url, headers = (babyai_url, AUTH) if env_name == "babyai" else (textcraft_url, None)
    task = make(env_name).tasks("test")[5]
    with session(url, headers) as client:
        sent = play(env_name, task, lambda task_id: client.reset(task_id=task_id), client.step, as_tool_call)
    assert all("tool_call" in body for body in sent)


def test_tool_calls_play_as_the_env_plays_their_text(callable_url):
    def as_call(env, action: str) -> dict[str, Any]:
        return {"tool_call": {"name": "act", "arguments": {"action": action}}}

    with session(callable_url) as client:
        play("test-callable-babyai", 3, lambda task: client.reset(task_id=task), client.step, as_call)
        client.reset(task_id=3)
        for call, reason in [
            ({"name": "jump", "arguments": {}}, "there is no function 'jump'"),
            ({"name": "act", "arguments": {"action": 3}}, "arguments of act at action"),
        ]:
            result = client.step({"tool_call": call})
            assert reason in result.observation["text"], result.observation
            assert (result.reward, result.done, result.metadata) == (0.0, False, {"action_valid": False})
        assert client.step({"text": "turn left"}).observation["metadata"]["action_valid"] is True


def test_two_sessions_do_not_share_state(babyai_url):
    envs = {task: make("babyai") for task in (3, 11)}
    with session(babyai_url, AUTH) as first, session(babyai_url, AUTH) as second:
        clients = {3: first, 11: second}
        for task, client in clients.items():
            assert client.reset(task_id=task).observation["text"] == envs[task].reset(task).text
        for _ in range(3):  # interleaved: each session's answers are its own env's
            for task, client in clients.items():
                action = envs[task].oracle_action()
                expected = envs[task].step(f"Action: {action}")
                result = client.step({"text": action})
                assert (result.observation["text"], result.reward) == (expected.observation, expected.reward)
        assert [clients[task].state()["task_id"] for task in (3, 11)] == [3, 11]
    http = httpx.Client(base_url=babyai_url, headers=AUTH, timeout=30)
    for name, task in [("a", 3), ("b", 11)]:
        assert http.post("/reset", json={"task_id": task, "episode_id": name}).status_code == 200
    alone = http.post("/step", json={"action": {"text": "turn left"}})  # no episode named: none to step
    assert alone.status_code == 409 and "episode_id" in alone.json()["detail"]
    for name, task in [("a", 3), ("b", 11)]:
        expected = make("babyai")
        expected.reset(task)
        step = http.post("/step", json={"action": {"text": "turn left"}, "episode_id": name}).json()
        assert step["observation"]["text"] == expected.step("Action: turn left").observation


def test_named_episodes_beyond_max_envs_make_room_for_the_newest():
    http = TestClient(build_openenv_app("babyai", max_envs=2))
    for name in ("a", "b", "c"):  # "a", the least recently used, is closed for "c"
        assert http.post("/reset", json={"task_id": 3, "episode_id": name}).status_code == 200
    closed = http.post("/step", json={"action": {"text": "turn left"}, "episode_id": "a"})
    assert closed.status_code == 404 and "closed to make room: 2 named episodes" in closed.json()["detail"]
    for name in ("b", "c"):
        assert http.post("/step", json={"action": {"text": "turn left"}, "episode_id": name}).status_code == 200
    assert http.post("/reset", json={"task_id": 3, "episode_id": "a"}).status_code == 200  # named again: a new one
    assert http.post("/step", json={"action": {"text": "turn left"}, "episode_id": "a"}).status_code == 200


def test_schema_is_valid_and_validates_the_bodies_sent(callable_url):
    http = httpx.Client(base_url=callable_url, timeout=30)
    schemas = http.get("/schema").json()
    assert set(schemas) == {"action", "observation", "reset_observation", "state"}
    for schema in schemas.values():
        jsonschema.Draft202012Validator.check_schema(schema)
    action = jsonschema.Draft202012Validator(schemas["action"])
    observation = jsonschema.Draft202012Validator(schemas["observation"])
    sent = [{"text": "turn left"}, {"tool_call": {"name": "act", "arguments": {"action": "turn right"}}}]
    for body in sent:
        action.validate(body)
    for wrong in [{}, {"text": 1}, {"txt": "turn left"}, {**sent[0], **sent[1]}, {"tool_call": {"name": "jump"}}]:
        assert not action.is_valid(wrong), wrong
    http.post("/reset", json={"task_id": 3, "episode_id": "schema"})
    for body in sent:
        answer = http.post("/step", json={"action": body, "episode_id": "schema"}).json()
        observation.validate({**answer["observation"], "reward": answer["reward"], "done": answer["done"]})
    state = jsonschema.Draft202012Validator(schemas["state"])
    with session(callable_url) as client:
        client.reset(task_id=3)
        state.validate(client.state())


def test_task_api_lists_splits_and_ids_and_resets_to_them(babyai_url):
    env = make("babyai")
    http = httpx.Client(base_url=babyai_url, headers=AUTH, timeout=30)
    assert [split["name"] for split in http.get("/babyai/splits").json()] == ["train", "test"]
    tasks = http.post("/babyai/tasks", json={"split": "test"}).json()["tasks"]
    assert [task["task_id"] for task in tasks] == list(env.tasks("test"))
    assert tasks[5] == {"task_id": 5, "split": "test", "index": 5, "category": env.task_category(5)}
    assert http.post("/babyai/num_tasks", json={"split": "train"}).json() == {"num_tasks": len(env.tasks("train"))}
    assert http.post("/babyai/task", json={"split": "test", "index": 9}).json()["task"]["task_id"] == 9
    with session(babyai_url, AUTH) as client:
        assert client.reset(split="test", index=9).observation["task_id"] == 9
        picked = {client.reset(seed=41).observation["task_id"] for _ in range(2)}
        assert picked == {env.tasks("train")[41 % len(env.tasks("train"))]}


def test_bad_requests_are_refused_with_a_4xx_naming_the_problem(babyai_url, textcraft_url):
    http = httpx.Client(base_url=babyai_url, headers=AUTH, timeout=30)

    def refused(response: httpx.Response, status: int, *words: str) -> None:
        assert response.status_code == status, response.text
        detail = json.dumps(response.json()["detail"])
        assert all(word in detail for word in words), detail

    refused(http.post("/reset", json={"task_id": -1}), 404, "task -1")
    refused(httpx.post(f"{textcraft_url}/reset", json={"task_id": 10**6}), 404, "task 1000000", "out of range")
    refused(http.post("/reset", json={"task_id": "3"}), 422, "task_id")
    refused(http.post("/reset", json={"task_idx": 3}), 422, "task_idx: unknown field")
    refused(http.post("/reset", json={"split": "dev", "index": 0}), 404, "no split 'dev'")
    refused(http.post("/reset", json={"split": "test", "index": 10**6}), 404, "no task at index 1000000")
    refused(http.post("/babyai/task", json={"split": "test", "index": -1}), 400, "Invalid task index")
    refused(http.post("/ghost/splits"), 405)
    refused(http.get("/ghost/splits"), 404, "unknown environment 'ghost'")
    http.post("/reset", json={"task_id": 3, "episode_id": "bad-bodies"})
    for action, word in [({"txt": "go"}, "txt"), ({"text": 5}, "text"), ({}, "text"), ("turn left", "action")]:
        refused(http.post("/step", json={"action": action, "episode_id": "bad-bodies"}), 422, word)
    refused(http.post("/step", json={"action": {"text": "x" * 100_001}, "episode_id": "bad-bodies"}), 413, "100001")
    refused(http.post("/step", json={"action": {"text": "go"}, "episode_id": "nobody"}), 404, "'nobody'")
    refused(http.post("/step", json={"action": {"text": "go"}, "episode_id": "bad-bodies", "x": 1}), 422, "x")
    refused(http.post("/step", content=b"\xff\xfe{", headers={"content-type": "application/json"}), 400, "parsing")
    refused(httpx.post(f"{babyai_url}/reset", json={}), 401, "bearer token")
    refused(httpx.post(f"{babyai_url}/reset", json={}, headers={"Authorization": "Bearer wrong"}), 401)
    assert httpx.get(f"{babyai_url}/openapi.json").status_code == 200
    with pytest.raises(ConnectionError, match="401"), session(babyai_url) as client:
        client.reset()
    with session(babyai_url, AUTH) as client:
        with pytest.raises(RuntimeError, match="cannot reset to task -1"):
            client.reset(task_id=-1)
        with pytest.raises(RuntimeError, match="no episode to step: reset first"):
            client.step({"text": "turn left"})
        with pytest.raises(RuntimeError, match="Invalid message"):
            client.step({"txt": "turn left"})
        assert client.reset(task_id=3).observation["task_id"] == 3  # the session goes on after errors


def test_without_openenv_the_command_names_the_extra(monkeypatch, capsys):
    from agentgym_rl.driver.cli import main

    for module in ("openenv", "openenv.core", "openenv.core.env_server", "openenv.core.env_server.types"):
        monkeypatch.setitem(sys.modules, module, None)  # as if the package were not installed
    monkeypatch.delitem(sys.modules, "agentgym_rl.envs.openenv.server")
    assert main(["env-server", "babyai", "--protocol", "openenv", "--port", str(free_port())]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert "needs the openenv package" in line and "pip install -e '.[openenv]'" in line, line


# Examples per operation: 10 in the CI tier, 200 in the slow tier (as tests/integration/test_openapi_fuzz.py).
@pytest.mark.parametrize("examples", [pytest.param(10, id="ci"), pytest.param(200, id="full", marks=pytest.mark.slow)])
def test_schemathesis_finds_no_server_error(examples):
    schema = schemathesis.openapi.from_asgi("/openapi.json", build_openenv_app("babyai", max_envs=4, token=TOKEN))
    config = schema.config
    config.update(continue_on_failure=True, headers=AUTH)
    config.cache.enabled = False  # no .schemathesis/ cache in the checkout: every run starts from the schema
    config.checks.update(included_check_names=["not_a_server_error"])
    config.phases.update(phases=["examples", "coverage", "fuzzing"])
    config.generation.update(max_examples=examples, deterministic=True)
    failures, cases = [], 0
    for event in from_schema(schema).execute():
        if isinstance(event, events.ScenarioFinished):
            cases += len(event.recorder.cases)
            for case_id, checks in event.recorder.checks.items():
                request = event.recorder.cases[case_id].value
                failures += [
                    f"{event.recorder.label}: {check.failure_info.failure.title} (body {request.body!r:.300})"
                    for check in checks
                    if check.failure_info is not None
                ]
        elif isinstance(event, (events.NonFatalError, events.FatalError)):
            failures.append(f"error: {event!r:.500}")
    assert cases > 50, "schemathesis should have sent requests to every route"
    assert not failures, "\n".join(failures)

"""Env ``openenv`` against OpenEnv servers written with the ``openenv`` package's own server classes: episodes,
tasks, tools, a server started by its command, the errors of a down, slow or garbled server (each naming the URL),
and ``agentgym-rl train`` on such a server, also when the server dies mid-run."""

from __future__ import annotations

import contextlib
import json
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pydantic
import pytest

pytest.importorskip("openenv", reason="the openenv extra: pip install -e '.[openenv]'")

from fastmcp import FastMCP
from openenv.core.env_server import MCPEnvironment, State, create_app
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from agentgym_rl.envs import EnvError, EnvUnavailable, InvalidAction, StepResult, ToolCall, make
from agentgym_rl.envs.openenv.client import OpenEnvError
from tests.e2e.helpers import run_cli
from tests.factories import RECIPE
from tests.integration import openenv_guess
from tests.integration.http_server import serve

REPO = Path(__file__).resolve().parents[2]
GUESS_SERVER = f"{sys.executable} -m tests.integration.openenv_guess"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def server_process(*command: str) -> Iterator[str]:
    """``command`` (given ``--port N`` here) in its own process, so that it can die; yields its URL once healthy."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = subprocess.Popen([*command, "--port", str(port)], cwd=REPO)
    try:
        deadline = time.monotonic() + 120
        while not _healthy(url):
            assert process.poll() is None and time.monotonic() < deadline, f"{command} did not start"
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(10)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=1).is_success
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def guess_url() -> Iterator[str]:
    with serve(openenv_guess.app()) as url:
        yield url


class Calculator(MCPEnvironment):
    """An OpenEnv MCP environment: its one tool adds two integers."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        mcp = FastMCP("calculator")

        @mcp.tool()
        def add(a: int, b: int) -> int:
            """Add two integers."""
            return a + b

        super().__init__(mcp)
        self._state = State()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **_: Any) -> CallToolObservation:
        return CallToolObservation(tool_name="reset", result=f"Add {seed} and 2.")

    def _step_impl(self, action: Any, timeout_s: float | None = None, **_: Any) -> CallToolObservation:
        raise ValueError("only tool calls")

    @property
    def state(self) -> State:
        return self._state


@pytest.fixture(scope="module")
def calculator_url() -> Iterator[str]:
    with serve(create_app(Calculator, CallToolAction, CallToolObservation, env_name="calculator")) as url:
        yield url


async def _garbled_session(websocket: WebSocket) -> None:
    """Resets answer properly; a step's message picks the fault: no answer, HTML, a wrong shape, an error."""
    await websocket.accept()
    answers = {
        "html": "<html>oops</html>",
        "shape": json.dumps({"type": "observation", "data": {"reward": 1}}),
        "crash": json.dumps({"type": "error", "data": {"message": "step raised KeyError", "code": "EXECUTION_ERROR"}}),
        "long": json.dumps(
            {
                "type": "error",
                "data": {
                    "message": "Invalid message",
                    "code": "VALIDATION_ERROR",
                    "errors": [{"loc": ["message"], "msg": "String should have at most 3 characters"}],
                },
            }
        ),
    }
    reset = {"type": "observation", "data": {"observation": {"prompt": "go"}, "reward": None, "done": False}}
    with contextlib.suppress(WebSocketDisconnect):
        while True:
            message = json.loads(await websocket.receive_text())
            if message["type"] == "reset":
                await websocket.send_text(json.dumps(reset))
            elif message["data"]["message"] in answers:
                await websocket.send_text(answers[message["data"]["message"]])
            # anything else ("slow") is never answered


async def _html(request: Request) -> PlainTextResponse:
    return PlainTextResponse("<html>not json</html>")


async def _not_a_list(request: Request) -> JSONResponse:
    return JSONResponse({"environments": "guess"})


@pytest.fixture(scope="module")
def garbled_url() -> Iterator[str]:
    routes = [
        Route("/schema", _html),
        Route("/list_environments", _not_a_list),
        WebSocketRoute("/ws", _garbled_session),
    ]
    with serve(Starlette(routes=routes)) as url:
        yield url


def test_plays_episodes_with_tasks_and_action_field_from_the_server(guess_url):
    env = make("openenv", {"base_url": guess_url})
    try:
        assert list(env.tasks("train")) == list(range(12))  # the task API: 12 train tasks, then 4 test tasks
        assert list(env.tasks("test")) == [12, 13, 14, 15]
        assert env.reset(13).text == "prompt: Guess the number in 0-9 (test task 1).\nguesses: 0"
        # `message`, the action schema's one string field, carries the text after "Action:"
        assert env.step("Lower than 9?\nAction: 5") == StepResult(
            observation="prompt: lower\nguesses: 1", reward=0.0, done=False, info={"guess": 5}
        )
        unparsed = env.step("no marker")  # answered here, never sent
        assert unparsed.info == {"action_valid": False} and "Action: <action>" in unparsed.observation
        last = env.step("Action: 0")
        assert (last.observation, last.reward, last.done) == ("prompt: correct\nguesses: 2", 1.0, True)
        assert env.reset(4).text.startswith("prompt: Guess the number in 0-9 (train task 4).")  # same session
        with pytest.raises(EnvError, match="unknown split 'dev'.*its splits: train, test"):
            env.tasks("dev")
        with pytest.raises(EnvError, match=r"task id 99 is in no split .* \(train 0-11, test 12-15\)"):
            env.reset(99)
    finally:
        env.close()


def test_options_pick_fields_tasks_and_reset_arguments(guess_url):
    env = make(
        "openenv",
        {
            "base_url": guess_url,
            "action_field": "message",
            "parse": "reply",
            "observation_fields": ["prompt"],
            "splits": {"train": [3, 5]},
            "reset_args": {"split": "test", "index": "{task_id}"},
        },
    )
    try:
        assert list(env.tasks("train")) == [3, 5]
        assert env.reset(5).text == "Guess the number in 0-9 (test task 5)."
        assert env.step("7").observation == "higher"  # the whole reply is the guess; test task 5 hides 8
        assert env.step("8").done
    finally:
        env.close()


def test_a_down_server_is_an_error_naming_its_url():
    port = free_port()
    env = make("openenv", {"base_url": f"http://127.0.0.1:{port}"})
    with pytest.raises(OpenEnvError, match=f"GET http://127.0.0.1:{port}/list_environments failed"):
        env.tasks("train")
    env = make("openenv", {"base_url": f"http://127.0.0.1:{port}", "splits": {"train": 2}, "action_field": "message"})
    assert list(env.tasks("train")) == [0, 1]  # nothing asked of the server
    with pytest.raises(EnvUnavailable, match=f"cannot open the OpenEnv session at ws://127.0.0.1:{port}/ws"):
        env.reset(0)
    env.close()


def test_a_slow_server_is_a_timeout_naming_its_url(garbled_url):
    env = make("openenv", {"base_url": garbled_url, "splits": {"train": 1}, "action_field": "message", "timeout": 0.5})
    try:
        env.reset(0)
        with pytest.raises(OpenEnvError, match=f"{re.escape(garbled_url)} sent no answer to a step within 0.5 s"):
            env.step("Action: slow")
        assert env.reset(0).text == "go"  # a late answer is never read: the next episode has a fresh session
    finally:
        env.close()


@pytest.mark.parametrize(
    ("action", "words"),
    [
        ("html", "answered a step with '<html>oops</html>', not an OpenEnv observation"),
        ("shape", "not an OpenEnv observation"),
        ("crash", "answered a step with an error: step raised KeyError"),
    ],
)
def test_a_garbled_answer_is_an_error_naming_the_url(garbled_url, action, words):
    env = make("openenv", {"base_url": garbled_url, "splits": {"train": 1}, "action_field": "message"})
    try:
        env.reset(0)
        with pytest.raises(OpenEnvError, match=f"the OpenEnv server at {re.escape(garbled_url)} .*{re.escape(words)}"):
            env.step(f"Action: {action}")
    finally:
        env.close()


def test_garbled_http_answers_and_a_refused_action(garbled_url):
    env = make("openenv", {"base_url": garbled_url, "splits": {"train": 1}})
    with pytest.raises(OpenEnvError, match=f"GET {re.escape(garbled_url)}/schema answered non-JSON"):
        env.tasks("train")
    with pytest.raises(EnvError, match="has no task API .*set|list its tasks in env.options.splits"):
        make("openenv", {"base_url": garbled_url}).tasks("train")
    env = make("openenv", {"base_url": garbled_url, "splits": {"train": 1}, "action_field": "message"})
    try:
        env.reset(0)
        refused = env.step("Action: long")  # the action's shape is the model's doing: it reads why
        assert (
            refused.observation
            == "The environment refused the action: message: String should have at most 3 characters"
        )
        assert refused.info == {"action_valid": False} and not refused.done
    finally:
        env.close()


def test_command_starts_a_server_per_instance_and_close_stops_it():
    options = {"base_url": "http://127.0.0.1:{port}", "command": f"{GUESS_SERVER} --port {{port}}"}
    env = make("openenv", options)
    try:
        assert len(env.tasks("test")) == 4
        url = env.base_url
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", url)
        assert "(test task 0)" in env.reset(12).text
    finally:
        env.close()
    assert not _healthy(url)

    broken = make("openenv", {**options, "command": f"{sys.executable} -c 'raise SystemExit(\"no such server\")'"})
    with pytest.raises(OpenEnvError, match="exited with code 1 before http://127.0.0.1:.*no such server"):
        broken.tasks("train")
    broken.close()
    with pytest.raises(OpenEnvError, match="'no-such-command --port"):
        make("openenv", {**options, "command": "no-such-command --port {port}"}).tasks("train")
    with pytest.raises(pydantic.ValidationError, match="only a `command` fills"):
        make("openenv", {"base_url": "http://127.0.0.1:{port}"})


def test_a_command_server_dies_with_the_process_that_started_it():
    # Ray kills an env actor without close(): its server must not outlive it.
    options = {"base_url": "http://127.0.0.1:{port}", "command": f"{GUESS_SERVER} --port {{port}}"}
    script = (
        "import os\nfrom agentgym_rl.envs import make\n"
        f"env = make('openenv', {options!r})\nenv.tasks('test')\nprint(env.base_url, flush=True)\nos._exit(0)"
    )
    started = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120, check=True
    )
    url = started.stdout.split()[-1]
    deadline = time.monotonic() + 30
    while _healthy(url):
        assert time.monotonic() < deadline, f"the server at {url} outlived the process that started it"
        time.sleep(0.1)


def test_an_mcp_environments_tools_are_functions(calculator_url):
    env = make(
        "openenv",
        {
            "base_url": calculator_url,
            "tools": "mcp",
            "splits": {"train": [4]},
            "observation_fields": ["result", "error"],
        },
    )
    try:
        [add] = env.functions()
        assert (add.name, add.description, sorted(add.parameters["properties"])) == (
            "add",
            "Add two integers.",
            ["a", "b"],
        )
        assert "- add: Add two integers." in env.instruction
        assert env.tool_instruction.endswith("call one tool.")  # env.action_format=tools: the format lists the tools
        assert env.reset(4).text == "Add 4 and 2."
        action = env.action_of_call(ToolCall(id="call_0", name="add", arguments={"a": 4, "b": 2}))
        assert action == 'Action: {"name": "add", "arguments": {"a": 4, "b": 2}}'
        assert "6" in env.step(action).observation
        assert isinstance(env.action_of_call(ToolCall(id="call_1", name="add", arguments={"a": "x"})), InvalidAction)
        assert "3" in env.step('Call it.\nAction: {"name": "add", "arguments": {"a": 1, "b": 2}}').observation
        assert env.step("Action: add 1 2").info == {"action_valid": False}
        unknown = env.step('Action: {"name": "sub", "arguments": {"a": 1, "b": 2}}')  # never sent
        assert unknown.info == {"action_valid": False} and "there is no function 'sub'" in unknown.observation
    finally:
        env.close()


def test_this_projects_server_plays_by_text_and_by_the_functions_its_action_schema_lists():
    from agentgym_rl.envs.openenv.server import build_openenv_app

    babyai = make("babyai", {"levels": ["GoToRedBall"]})
    with serve(build_openenv_app("babyai", {"levels": ["GoToRedBall"]}, max_envs=4)) as url:
        text = make("openenv", {"base_url": url, "parse": "reply", "observation_fields": ["text"]})
        tools = make(
            "openenv", {"base_url": url, "tools": "action-schema", "parse": "reply", "observation_fields": ["text"]}
        )
        try:
            # the task API numbers the test split after the train split; `text` is the action's one string field
            test = list(text.tasks("test"))
            assert len(test) == len(babyai.tasks("test")) and test[0] == len(babyai.tasks("train"))
            first = text.reset(test[0]).text
            assert first.startswith("Your goal: go to")
            assert text.step("Action: turn left").info["action_valid"]
            # the functions are BabyAI's own, from the action schema's `tool_call` field
            assert [f.name for f in tools.functions()] == [f.name for f in babyai.functions()]
            assert tools.reset(test[0]).text == first
            action = tools.action_of_call(ToolCall(id="call_0", name="turn_left", arguments={}))
            assert action == 'Action: {"name": "turn_left", "arguments": {}}'
            assert tools.step(action).info["action_valid"]
        finally:
            text.close()
            tools.close()
            babyai.close()


# tiny-random through the real CLI, its whole reply the action; 2 tasks x 2 samples an iteration.
TRAIN = [
    "model.name=tiny-random",
    "warm_start.iterations=0",
    "trainer.iterations=2",
    "trainer.tasks_per_iteration=2",
    "algorithm.group_size=2",
    "sampler.envs_per_sampler=2",
    "curriculum.horizons=[2]",
    "sampler.sampling.max_new_tokens=8",
    "algorithm.skip_uniform_groups=false",  # tiny-random never guesses right: train on the uniform groups too
    "logging.progress=false",
    "env.name=openenv",
]


def train(
    url: str, tmp_path: Path, options: dict[str, Any]
) -> tuple[subprocess.CompletedProcess, list[dict[str, Any]], Path]:
    """``agentgym-rl train`` with env ``openenv`` on the server at ``url``: its output, metrics and run directory."""
    env_options = json.dumps({"base_url": url, **options})
    settings = [*TRAIN, f"env.options={env_options}", f"run.dir={tmp_path}", "run.name=openenv"]
    result = run_cli("train", RECIPE, *[arg for item in settings for arg in ("--set", item)], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "openenv"
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return result, metrics, run_dir


# docs/examples/openenv_train.py trains on an OpenEnv server in the CI tier (tests/e2e/test_examples.py).
@pytest.mark.slow
def test_train_two_iterations_on_an_openenv_server(guess_url, tmp_path):
    _, metrics, run_dir = train(guess_url, tmp_path, {"parse": "reply"})
    assert [(m["iteration"], m["rollout/failed"], m["rollout/episodes"]) for m in metrics] == [(0, 0, 4), (1, 0, 4)]
    assert all("learner/loss" in m for m in metrics)
    episodes = [json.loads(line) for line in (run_dir / "trajectories" / "iter_000001.jsonl").read_text().splitlines()]
    assert len(episodes) == 4 and {e["env"] for e in episodes} == {"openenv"}
    assert all("Guess the number in 0-9 (train task" in e["messages"][1]["content"] for e in episodes)


@pytest.mark.slow
def test_a_server_killed_mid_run_fails_its_episodes_and_the_run_goes_on(tmp_path):
    # The server exits at its 5th reset: iteration 0 plays its 4 episodes, iteration 1 finds the server gone.
    with server_process(*GUESS_SERVER.split(), "--die-at-reset", "5") as url:
        result, metrics, _ = train(url, tmp_path, {"parse": "reply"})
    assert [(m["iteration"], m["rollout/failed"]) for m in metrics] == [(0, 0), (1, 4)]
    assert "learner/loss" in metrics[0]
    log = result.stdout + result.stderr
    assert re.search(rf"env actor failed; replacing it .*OpenEnvError: .*{re.escape(url.removeprefix('http://'))}", log)


@pytest.mark.slow
def test_train_two_iterations_on_this_projects_openenv_server(tmp_path):
    # `agentgym-rl env-server babyai --protocol openenv`: its action field `text` receives the whole reply, which
    # BabyAI parses as the in-process env would; the model reads the observation's `text`.
    server = [str(Path(sys.executable).parent / "agentgym-rl"), "env-server", "babyai", "--protocol", "openenv"]
    with server_process(*server, "--options", json.dumps({"levels": ["GoToRedBall"]})) as url:
        _, metrics, run_dir = train(url, tmp_path, {"parse": "reply", "observation_fields": ["text"]})
    assert [(m["iteration"], m["rollout/failed"], m["rollout/episodes"]) for m in metrics] == [(0, 0, 4), (1, 0, 4)]
    episodes = [json.loads(line) for line in (run_dir / "trajectories" / "iter_000001.jsonl").read_text().splitlines()]
    assert all(re.match("Your goal: go to (the|a) red ball", e["messages"][1]["content"]) for e in episodes)

"""The AgentGym-compatible env server and client: real uvicorn on 127.0.0.1, real httpx, real envs."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import ray
from pydantic import ValidationError

from agentgym_rl import envs
from agentgym_rl.envs.actor import create_env_actor
from agentgym_rl.envs.babyai import NOT_RECOGNIZED, BabyAIEnv
from agentgym_rl.envs.base import EnvError, StepResult
from agentgym_rl.envs.http import AgentGymClient, build_app
from agentgym_rl.envs.http.client import NO_ACTION
from agentgym_rl.envs.registry import register
from tests.integration.http_server import serve

RELEASE = threading.Event()


class FaultyBabyAI(BabyAIEnv):
    """BabyAI with two extra actions for the tests: ``explode`` raises, ``block`` waits for RELEASE."""

    def step(self, action_text: str) -> StepResult:
        if action_text.endswith("explode"):
            raise RuntimeError("boom")
        if action_text.endswith("block"):
            assert RELEASE.wait(timeout=60), "the test never released the blocked step"
        return super().step(action_text)


class UnstartableEnv(BabyAIEnv):
    """An env whose instances cannot start, like SciWorld without a Java runtime."""

    def __init__(self, **options) -> None:
        raise EnvError("no java binary on PATH")


register("test-faulty-babyai", f"{__name__}:FaultyBabyAI")
register("test-unstartable", f"{__name__}:UnstartableEnv")


@pytest.fixture(scope="module")
def babyai_url() -> Iterator[str]:
    with serve(build_app("babyai", {"levels": ["GoToRedBall", "GoToRedBallNoDists"]}, max_envs=16)) as url:
        yield url


@pytest.fixture(scope="module")
def faulty_url() -> Iterator[str]:
    with serve(build_app("test-faulty-babyai", max_envs=3)) as url:
        yield url


@pytest.fixture()
def http(babyai_url) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=babyai_url, timeout=30) as client:
        yield client


def new_env(http: httpx.Client, task: int | None = 1) -> int:
    env_id = http.post("/create").json()["id"]
    if task is not None:
        assert http.post("/reset", json={"id": env_id, "data_idx": task}).status_code == 200
    return env_id


def assert_error(response: httpx.Response, status: int, *words: str) -> None:
    assert response.status_code == status, response.text
    message = response.json()["error"]
    for word in words:
        assert word in message, message


# ------------------------------------------------------------------------------- same episodes


def episode(step, reset, task: int, actions: list[str]) -> list[tuple[str, float, bool]]:
    """(observation, reward, done) of the reset and of each action, stopping when the episode ends."""
    turns = [(reset(task).text, 0.0, False)]
    for action in actions:
        result = step(action)
        turns.append((result.observation, result.reward, result.done))
        if result.done:
            break
    return turns


@pytest.mark.parametrize("action_format", ["reply", "parsed"])
def test_actor_and_http_client_play_identical_episodes(ray_local, babyai_url, action_format):
    oracle = BabyAIEnv(levels=["GoToRedBall", "GoToRedBallNoDists"])
    tasks = [1, 2, 41, 122]
    # Extra turns first: a listing, a full model reply, an unknown action, a reply with no Action line
    # (a bare action: invalid for the parser), the turn undone; then the oracle's actions.
    scripts = {
        t: [
            "Action: check available actions",
            "Thought: hmm.\nAction: Turn Left.",
            "Action: fly away",
            "turn right",
            "Action: turn right",
        ]
        + [f"Action: {a}" for a in oracle.oracle_episode(t)]
        for t in tasks
    }
    oracle.close()
    levels = {"levels": ["GoToRedBall", "GoToRedBallNoDists"]}
    local = create_env_actor("babyai", levels)
    remote_options = {"base_url": babyai_url, "env_name": "babyai", "env_options": levels}
    remote = create_env_actor("agentgym-remote", {**remote_options, "action_format": action_format})
    for task, script in scripts.items():
        runs = [
            episode(lambda a, h=h: ray.get(h.step.remote(a)), lambda t, h=h: ray.get(h.reset.remote(t)), task, script)
            for h in (local, remote)
        ]
        assert runs[0] == runs[1]
        assert runs[0][-1][2] and runs[0][-1][1] > 0, "the oracle's episode should end in success"
        assert NOT_RECOGNIZED in runs[0][3][0] and "No action found" in runs[0][4][0]
    assert ray.get(local.instruction.remote()) == ray.get(remote.instruction.remote())
    assert ray.get(local.tasks.remote("test")) == ray.get(remote.tasks.remote("test"))
    ray.get([local.close.remote(), remote.close.remote()])


def oracle_script(env, task: int) -> list[str]:
    """The env's oracle actions for ``task`` as model replies (bare ones gain an ``Action:`` line)."""
    actions = env.oracle_episode(task) if hasattr(env, "oracle_episode") else env.oracle_actions(task)
    return [a if isinstance(env.parse_action(a), str) else f"Action: {a}" for a in actions]


@pytest.mark.parametrize("name", [n for n in envs.names() if n != "agentgym-remote" and not n.startswith("test-")])
def test_every_env_plays_the_same_oracle_episode_in_process_and_over_http(name):
    try:
        local = envs.make(name)
        task = local.tasks("test")[0]
        script = oracle_script(local, task)
    except (EnvError, ValidationError) as exc:  # an env that needs options (a server's address, a task file)
        pytest.skip(f"{name} cannot start here: {exc}")
    with serve(build_app(name, max_envs=2)) as url:
        remote = AgentGymClient(base_url=url, env_name=name)
        runs = [episode(env.step, env.reset, task, script) for env in (local, remote)]
        remote.close()
    local.close()
    assert runs[0] == runs[1]
    assert runs[0][-1][2], f"the oracle's episode of {name} task {task} should end"


def test_agentgym_style_bare_actions_and_running_score(http):
    env_id = new_env(http, task=1)
    actions = BabyAIEnv(levels=["GoToRedBall"]).oracle_episode(1)
    bodies = [http.post("/step", json={"id": env_id, "action": a}).json() for a in actions]
    assert bodies[-1]["done"] and bodies[-1]["info"]["success"]
    assert bodies[-1]["score"] == pytest.approx(sum(b["reward"] for b in bodies))
    assert http.get("/observation", params={"id": env_id}).json()["observation"] == bodies[-1]["observation"]
    reset = http.post("/reset", json={"id": env_id, "data_idx": 2}).json()
    assert set(reset) >= {"observation", "reward", "score", "deleted", "done"}
    assert reset["observation"].startswith("Your goal: ") and reset["score"] == 0.0 and not reset["done"]


# ------------------------------------------------------------------------------------ bad input

BAD_REQUESTS = [
    # (method, path, kwargs, status, words in the error)
    ("post", "/reset", {"json": {"id": 10_000, "data_idx": 1}}, 404, ("unknown env id 10000",)),
    ("post", "/step", {"json": {"id": 10_000, "action": "x"}}, 404, ("unknown env id",)),
    ("get", "/observation", {"params": {"id": 10_000}}, 404, ("unknown env id",)),
    ("post", "/close", {"json": {"id": 10_000}}, 404, ("unknown env id",)),
    ("post", "/reset", {"json": {"id": "{env}", "data_idx": -1}}, 404, ("task -1", "non-negative")),
    ("post", "/reset", {"json": {"id": "{env}", "data_idx": 0}}, 404, ("GoToRedBallGrey", "configured levels")),
    ("post", "/reset", {"json": {"id": "{env}", "data_idx": "one"}}, 422, ("data_idx",)),
    ("post", "/reset", {"json": {"id": "{env}", "data_idx": 1.5}}, 422, ("data_idx",)),
    ("post", "/reset", {"json": {"id": "{env}"}}, 422, ("data_idx", "Field required")),
    ("post", "/step", {"json": {"id": "{env}", "action": 7}}, 422, ("action",)),
    ("post", "/step", {"json": {"id": "{env}", "act": "turn left"}}, 422, ("action",)),
    ("post", "/step", {"json": ["turn left"]}, 422, ("malformed",)),
    ("post", "/step", {"content": b'{"id": 0, "action": ', "headers": {"content-type": "application/json"}}, 400, ()),
    (
        "post",
        "/step",
        {"content": '{"id": 0, "action": "x"}'.encode("utf-16"), "headers": {"content-type": "application/json"}},
        400,
        ("UTF-8",),
    ),
    (
        "post",
        "/step",
        {"content": b'{"id": 0, "action": "\xff\xfe"}', "headers": {"content-type": "application/json"}},
        400,
        (),
    ),
    ("post", "/step", {"json": {"id": "{env}", "action": "x" * 1_048_576}}, 413, ("1048576", "at most")),
    ("get", "/observation", {}, 422, ("id",)),
]


@pytest.mark.parametrize(("method", "path", "kwargs", "status", "words"), BAD_REQUESTS)
def test_bad_requests_get_json_errors_while_another_env_keeps_serving(http, method, path, kwargs, status, words):
    victim, bystander = new_env(http), new_env(http)
    if "json" in kwargs and isinstance(kwargs["json"], dict) and kwargs["json"].get("id") == "{env}":
        kwargs = {**kwargs, "json": {**kwargs["json"], "id": victim}}
    assert_error(getattr(http, method)(path, **kwargs), status, *words)
    served = http.post("/step", json={"id": bystander, "action": "check available actions"})
    assert served.status_code == 200 and served.json()["observation"].startswith("You can take the following")
    for env_id in (victim, bystander):
        assert http.post("/close", json={"id": env_id}).json() is True


@pytest.mark.parametrize(
    ("action", "expected"),
    [
        ("", "No action found"),
        ("Thought: no idea what to do", NOT_RECOGNIZED),
        ("fly \udcff\udcfe away", NOT_RECOGNIZED),  # lone surrogates: what JSON gives for non-UTF-8 bytes
        ("go to red ball 1 " * 5000, NOT_RECOGNIZED),  # long but within the server's limit
    ],
)
def test_malformed_actions_are_informative_observations(http, action, expected):
    env_id = new_env(http)
    # Sent as ASCII JSON so that lone surrogates travel as \\udcff escapes, as a JSON client may send them.
    payload = json.dumps({"id": env_id, "action": action})
    body = http.post("/step", content=payload, headers={"content-type": "application/json"}).json()
    assert expected in body["observation"] and body["reward"] == 0.0 and not body["done"]
    assert body["info"]["action_valid"] is False
    http.post("/close", json={"id": env_id})


def test_step_before_reset_and_after_done_is_409(http):
    env_id = new_env(http, task=None)
    assert_error(http.post("/step", json={"id": env_id, "action": "turn left"}), 409, "POST /reset first")
    assert_error(http.get("/observation", params={"id": env_id}), 409, "POST /reset first")
    http.post("/reset", json={"id": env_id, "data_idx": 1})
    for action in BabyAIEnv(levels=["GoToRedBall"]).oracle_episode(1):
        last = http.post("/step", json={"id": env_id, "action": action}).json()
    assert last["done"]
    assert_error(http.post("/step", json={"id": env_id, "action": "turn left"}), 409, "is over")
    assert http.post("/reset", json={"id": env_id, "data_idx": 1}).status_code == 200
    assert http.post("/step", json={"id": env_id, "action": "turn left"}).status_code == 200


# ------------------------------------------------------------------------- lifecycle and limits


def test_close_frees_the_env_and_the_cap_returns_429(faulty_url):
    with httpx.Client(base_url=faulty_url, timeout=30) as http:
        ids = [http.post("/create").json()["id"] for _ in range(3)]
        assert ids == sorted(ids) and len(set(ids)) == 3
        assert_error(http.post("/create"), 429, "3 envs are live")
        assert http.post("/close", json={"id": ids[0]}).json() is True
        assert_error(http.post("/reset", json={"id": ids[0], "data_idx": 1}), 404, f"env id {ids[0]} was closed")
        assert http.post("/close", json={"id": ids[0]}).json() is False  # a second close, as AgentGym answers it
        fresh = http.post("/create").json()["id"]
        assert fresh > ids[-1]
        for env_id in [*ids[1:], fresh]:
            http.post("/close", json={"id": env_id})


def test_env_that_cannot_start_is_503_and_frees_its_slot():
    with serve(build_app("test-unstartable", max_envs=1)) as url:
        for _ in range(2):  # a failed start must not use up the only slot
            assert_error(httpx.post(f"{url}/create"), 503, "cannot start", "no java binary")


def test_env_exception_is_500_json_and_other_envs_keep_serving(faulty_url):
    with httpx.Client(base_url=faulty_url, timeout=30) as http:
        broken, healthy = new_env(http), new_env(http)
        assert_error(http.post("/step", json={"id": broken, "action": "explode"}), 500, "RuntimeError", "boom")
        assert http.post("/step", json={"id": healthy, "action": "turn left"}).status_code == 200
        assert http.post("/step", json={"id": broken, "action": "turn left"}).status_code == 200
        for env_id in (broken, healthy):
            http.post("/close", json={"id": env_id})


def test_a_blocked_env_does_not_stall_the_others(faulty_url):
    RELEASE.clear()
    with httpx.Client(base_url=faulty_url, timeout=30) as http:
        blocked, free = new_env(http), new_env(http)
        with httpx.Client(base_url=faulty_url, timeout=60) as other:
            pending = threading.Thread(
                target=other.post, args=("/step",), kwargs={"json": {"id": blocked, "action": "block"}}
            )
            pending.start()
            # While env `blocked` sits in its step, env `free` is served (else this would hang until the timeout).
            for _ in range(3):
                assert http.post("/step", json={"id": free, "action": "turn left"}).status_code == 200
            assert pending.is_alive()
            RELEASE.set()
            pending.join(timeout=30)
        for env_id in (blocked, free):
            http.post("/close", json={"id": env_id})


def test_bearer_token_is_required_when_set():
    with serve(build_app("babyai", max_envs=2, token="s3cret")) as url:
        assert_error(httpx.post(f"{url}/create"), 401, "bearer token")
        assert_error(httpx.post(f"{url}/create", headers={"Authorization": "Bearer nope"}), 401)
        client = AgentGymClient(base_url=url, env_name="babyai", token="s3cret")
        assert client.reset(1).text.startswith("Your goal: ")
        client.close()


def test_search_speaks_deep_search_env_idx_protocol():
    with serve(build_app("search", max_envs=2)) as url, httpx.Client(base_url=url, timeout=30) as http:
        env_idx = http.post("/create", json={"id": 0}).json()
        assert isinstance(env_idx, int)
        assert http.get("/observation", params={"env_idx": env_idx}).json().startswith("Question: ")
        prompt = http.post("/reset", json={"env_idx": env_idx, "id": 1}).json()
        assert isinstance(prompt, str) and prompt.startswith("Question: ")
        body = http.post("/step", json={"env_idx": env_idx, "action": "<answer>nobody</answer>"}).json()
        assert set(body) == {"observation", "reward", "done", "info"} and body["done"] and body["reward"] == 0.0
        assert_error(http.post("/step", json={"id": env_idx, "action": "x"}), 422, "env_idx")
        assert_error(http.post("/reset", json={"env_idx": 99, "id": 1}), 404, "unknown env id 99")
        for _ in range(3):  # a bad question id at /create frees the env it made
            assert_error(http.post("/create", json={"id": 10**9}), 404, "out of range")
        assert http.post("/close", json={"env_idx": env_idx}).json() is True
        assert http.post("/close", json={"env_idx": env_idx}).json() is False


# ------------------------------------------------------------------------------------- client


def test_generic_client_for_an_env_this_project_does_not_know(babyai_url):
    client = AgentGymClient(base_url=babyai_url, splits={"test": [1, 2]}, instruction="Play.")
    assert client.instruction == "Play." and list(client.tasks("test")) == [1, 2]
    with pytest.raises(EnvError, match="unknown split 'train'"):
        client.tasks("train")
    assert client.parse_action("I think.\nAction:  turn left \nmore") == "turn left"
    assert client.parse_action("no marker").reason == NO_ACTION
    assert client.reset(1).text.startswith("Your goal: ")
    assert client.step("Thought: x\nAction: turn left").info["action_valid"] is True
    client.close()


def test_client_reports_server_errors_and_unreachable_servers(babyai_url):
    client = AgentGymClient(base_url=babyai_url, env_name="babyai")
    with pytest.raises(EnvError, match="HTTP 404.*task -5"):
        client.reset(-5)
    client.close()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dead = AgentGymClient(base_url=f"http://127.0.0.1:{port}", timeout=2)
    with pytest.raises(EnvError, match="failed"):
        dead.reset(1)
    dead.close()


def test_cli_env_server_serves_on_loopback():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    options = json.dumps({"levels": ["GoToRedBall"]})
    cmd = [
        sys.executable,
        "-m",
        "agentgym_rl.driver.cli",
        "env-server",
        "babyai",
        "--port",
        str(port),
        "--options",
        options,
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        client = AgentGymClient(base_url=f"http://127.0.0.1:{port}", env_name="babyai", timeout=5)
        deadline = time.monotonic() + 60
        while True:
            try:
                observation = client.reset(1)
                break
            except EnvError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read().decode()
                time.sleep(0.2)
        assert observation.text.startswith("Your goal: go to the red ball")
        with pytest.raises(EnvError, match="HTTP 404.*configured levels"):
            client.reset(2)
        client.close()
    finally:
        proc.terminate()
        proc.wait(timeout=20)

"""The web env as a Ray ``EnvActor``, behind ``agentgym-rl env-server web``, through the ``webarena-remote``
client against an AgentGym-WebArena-style server, and its process and file-descriptor hygiene."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from typing import Annotated, Any

import psutil
import pytest
import ray
from fastapi import Body, FastAPI
from fastapi.responses import PlainTextResponse

from agentgym_rl.actors.weight_sync import free_port
from agentgym_rl.envs.actor import create_env_actor
from agentgym_rl.envs.base import EnvError
from agentgym_rl.envs.http import AgentGymClient
from agentgym_rl.envs.http.client import RemoteEnvError
from agentgym_rl.envs.web import WebArenaClient, WebEnv
from agentgym_rl.envs.web.tasks import TASKS
from tests.integration.http_server import serve

pytestmark = pytest.mark.skipif(
    shutil.which("chromium") is None and shutil.which("chromium-browser") is None,
    reason="no system Chromium: install the OS package (./install.sh does, as root)",
)
CLI = [sys.executable, "-m", "agentgym_rl.driver.cli"]
JsonBody = Annotated[dict[str, Any], Body()]


def fenced(action: str) -> str:
    return f"In summary, the next action I will perform is ```{action}```"


def browser_processes(pid: int) -> list[psutil.Process]:
    """Chromium and Playwright-driver processes below ``pid``."""
    found = []
    for process in psutil.Process(pid).children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            command = " ".join(process.cmdline()).lower()
            if "chrom" in process.name().lower() or "playwright" in command:
                found.append(process)
    return found


@pytest.fixture(scope="module")
def oracle_scripts() -> dict[int, list[str]]:
    """The oracle's actions for a shop task and a forum task, from an in-process env."""
    env = WebEnv()
    scripts = {task: env.oracle_episode(task) for task in (35, 60)}
    env.close()
    return scripts


# --------------------------------------------------------------------------------- EnvActor


def test_env_actor_plays_to_success_and_survives_a_killed_browser(ray_local):
    actor = create_env_actor("web")
    assert ray.get(actor.reset.remote(60)).text.startswith("OBSERVATION:\nTab 0 (current): Forums - Forum")
    while True:
        result = ray.get(actor.step.remote(ray.get(actor.oracle_reply.remote())))
        if result.done:
            break
    assert result.reward == 1.0 and result.info["success"]
    actor_pid = ray.get(actor.__ray_call__.remote(lambda host: os.getpid()))
    victims = [p for p in browser_processes(actor_pid) if "chrom" in p.name().lower()]
    assert victims, "the actor should run its Chromium as a child process"
    ray.get(actor.reset.remote(35))
    for process in victims:
        with contextlib.suppress(psutil.NoSuchProcess):  # killing the main process takes its helpers along
            process.kill()
    psutil.wait_procs(victims, timeout=10)
    restarted = ray.get(actor.step.remote(fenced("scroll [down]")))
    assert "restarted" in restarted.observation and "URL: http://shop.test/\n" in restarted.observation
    assert ray.get(actor.__ray_call__.remote(lambda host: os.getpid())) == actor_pid  # same actor, new browser
    ray.get(actor.reset.remote(35))
    result = ray.get(actor.step.remote(ray.get(actor.oracle_reply.remote())))
    while not result.done:
        result = ray.get(actor.step.remote(ray.get(actor.oracle_reply.remote())))
    assert result.reward == 1.0
    ray.get(actor.close.remote())
    assert browser_processes(actor_pid) == []
    ray.kill(actor)


# ------------------------------------------------------------------------------ env-server


def test_cli_env_server_serves_web_episodes(oracle_scripts):
    port = free_port()
    proc = subprocess.Popen([*CLI, "env-server", "web", "--port", str(port), "--max-envs", "2"])
    try:
        client = AgentGymClient(base_url=f"http://127.0.0.1:{port}", env_name="web", timeout=60)
        deadline = time.monotonic() + 60
        while True:
            try:
                first = client.reset(60)
                break
            except EnvError:
                assert proc.poll() is None and time.monotonic() < deadline, "env-server did not come up"
                time.sleep(0.3)
        local = WebEnv()
        assert first.text == local.reset(60).text
        for action in oracle_scripts[60]:
            remote_result, local_result = client.step(fenced(action)), local.step(fenced(action))
            assert remote_result.observation == local_result.observation
        assert remote_result.done and remote_result.reward == 1.0 and remote_result.info["success"]
        local.close()
        assert browser_processes(proc.pid), "the server's env should hold a browser"
        client.close()  # POST /close closes the env and its browser
        assert browser_processes(proc.pid) == []
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# -------------------------------------------------------------------------- webarena-remote


def agentgym_webarena_app() -> FastAPI:
    """A server with the routes and bodies of AgentGym's ``agentenv-webarena`` server, over ``WebEnv``."""
    app = FastAPI()
    envs: dict[int, WebEnv] = {}
    prompts: dict[int, str] = {}

    @app.post("/create")
    def create() -> dict[str, int]:
        env_idx = len(envs)
        envs[env_idx] = WebEnv()
        return {"env_idx": env_idx}

    @app.post("/reset")
    def reset(body: JsonBody) -> dict[str, str]:
        assert body["seed"] == 0
        prompts[body["env_idx"]] = envs[body["env_idx"]].reset(body["idx"]).text
        tree = prompts[body["env_idx"]].removeprefix("OBSERVATION:\n").split("\nURL: ")[0]
        return {"observation": tree}

    @app.get("/observation")
    def observation(env_idx: int) -> str:
        return prompts[env_idx]

    @app.post("/step")
    def step(body: JsonBody) -> dict[str, Any]:
        result = envs[body["env_idx"]].step(body["action"])
        prompts[body["env_idx"]] = result.observation
        return {
            "observation": result.observation,
            "reward": result.reward,
            "terminated": result.done,
            "truncated": False,
            "info": result.info,
        }

    @app.post("/close")
    def close(body: JsonBody) -> PlainTextResponse:
        envs.pop(body["env_idx"]).close()
        return PlainTextResponse("closed")

    app.state.envs = envs
    return app


def test_webarena_remote_client_plays_an_agentgym_webarena_server(ray_local, oracle_scripts):
    app = agentgym_webarena_app()
    with serve(app) as url:
        options = {"base_url": url, "splits": {"test": [35], "train": [60]}}
        actor = create_env_actor("webarena-remote", options)
        assert ray.get(actor.tasks.remote("test")) == [35]
        first = ray.get(actor.reset.remote(35)).text
        assert first.startswith("OBSERVATION:\nTab 0 (current): Home - One Stop Shop")
        assert f"OBJECTIVE: {TASKS[35].intent}" in first
        bad = ray.get(actor.step.remote("no fenced block here"))
        assert "No action found" in bad.observation and bad.info["action_valid"] is False and not bad.done
        ray.get(actor.reset.remote(35))
        for action in oracle_scripts[35]:
            result = ray.get(actor.step.remote(fenced(action)))
        assert result.done and result.reward == 1.0
        ray.get(actor.close.remote())
        assert app.state.envs == {}  # /close reached the server
        ray.kill(actor)
    with pytest.raises(RemoteEnvError, match="failed"):
        WebArenaClient(base_url=f"http://127.0.0.1:{free_port()}", timeout=2).reset(0)


# ------------------------------------------------------------------------------ hygiene


@pytest.mark.slow
def test_fifty_episodes_leave_no_browser_processes_and_bounded_fds():
    me = psutil.Process()
    rng = random.Random(0)
    kinds = ["click [{i}]", "hover [{i}]", "type [{i}] [abc] [{b}]", "scroll [down]", "go_back", "new_tab", "close_tab"]
    threads_before, fds_before = threading.active_count(), me.num_fds()
    fds_after: list[int] = []
    seen: list[psutil.Process] = []
    for _ in range(5):
        env = WebEnv(action_timeout=0.5)
        for _ in range(10):
            env.reset(rng.choice(TASKS).id)
            for _ in range(10):
                result = env.step(fenced(rng.choice(kinds).format(i=rng.randint(1, 30), b=rng.randint(0, 1))))
                assert not result.done
            seen.extend(browser_processes(me.pid))
        running = browser_processes(me.pid)
        drivers = [p for p in running if "chrom" not in p.name().lower()]
        browsers = [p for p in running if "chrom" in p.name().lower() and "--type=" not in " ".join(p.cmdline())]
        assert len(drivers) == 1 and len(browsers) == 1  # one Playwright driver, one Chromium per env
        env.close()
        assert browser_processes(me.pid) == []
        fds_after.append(me.num_fds())
    print(f"open fds: {fds_before} before, {fds_after} after each of 5 envs x 10 episodes x 10 steps")
    still_running = [p for p in seen if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert still_running == []
    assert threading.active_count() <= threads_before + 1
    # Playwright and the site servers may keep a few descriptors cached; growth must not scale with episodes.
    assert max(fds_after) - fds_before <= 8 and fds_after[-1] - fds_after[0] <= 2, (fds_before, fds_after)

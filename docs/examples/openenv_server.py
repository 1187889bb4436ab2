"""Serve BabyAI over OpenEnv and play one held-out episode with openenv's own client.

    python docs/examples/openenv_server.py

It starts `agentgym-rl env-server babyai --protocol openenv` (with a bearer token), asks the task API for the
test split, and plays its first task over the WebSocket session with `openenv.core.GenericEnvClient`, the client
TRL's and SkyRL's OpenEnv integrations build on. The agent here is BabyAI's own oracle, which plays the env in
this process and stands in for a model; the server knows nothing of it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from openenv.core import GenericEnvClient

from agentgym_rl.envs import make

TOKEN = "example-token"
HEADERS = {"Authorization": f"Bearer {TOKEN}"}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(port: int) -> subprocess.Popen:
    """`agentgym-rl env-server babyai --protocol openenv --port PORT`, with the token from the environment."""
    cli = Path(sys.executable).parent / "agentgym-rl"
    command = [str(cli)] if cli.exists() else [sys.executable, "-m", "agentgym_rl.driver.cli"]
    command += ["env-server", "babyai", "--protocol", "openenv", "--port", str(port)]
    server = subprocess.Popen(command, env={**os.environ, "AGENTGYM_ENV_TOKEN": TOKEN})
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", headers=HEADERS, timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            raise SystemExit("the server did not start")
        time.sleep(0.2)


def main() -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = start_server(port)
    try:
        # The task API: the env's splits and the ids of the held-out split.
        splits = [split["name"] for split in httpx.get(f"{url}/babyai/splits", headers=HEADERS).json()]
        tasks = httpx.post(f"{url}/babyai/tasks", json={"split": "test"}, headers=HEADERS).json()["tasks"]
        task_id = tasks[0]["task_id"]
        print(f"splits {splits}; {len(tasks)} test tasks; playing task {task_id} ({tasks[0]['category']})")

        agent = make("babyai")  # the oracle: a model would choose the actions instead
        agent.reset(task_id)
        with GenericEnvClient(base_url=url, headers=HEADERS).sync() as env:
            result = env.reset(task_id=task_id)
            print(result.observation["text"].splitlines()[0])
            turns = 0
            while not result.done:
                action = agent.oracle_action()
                agent.step(f"Action: {action}")
                result = env.step({"text": action})
                turns += 1
                print(f"  {action!r:30} reward {result.reward:.3f} done {result.done}")
            state = env.state()
        print(f"done in {turns} turns, reward {result.reward:.3f}, success {result.observation['metadata']['success']}")
        assert result.observation["metadata"]["success"] and result.reward > 0
        assert state["task_id"] == task_id and state["step_count"] == turns
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    main()

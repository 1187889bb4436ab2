"""Episodes kept on one replica (Ray Serve on 127.0.0.1, two tiny-random replicas with a prefix cache): with
``serve.episode_affinity`` every call of an episode is served by one replica, and more of the prompts come from the
replicas' prefix caches than in the same run with affinity off."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from agentgym_rl.actors.model_store import TINY_RANDOM
from agentgym_rl.actors.weight_sync import free_port
from agentgym_rl.configs.schema import ServeConfig
from agentgym_rl.serve.app import ServeArgs, start_server, stop_server

EPISODES = 8
TURNS = 4
MAX_TOKENS = 6
SYSTEM = {"role": "system", "content": "You play a grid game. Answer with one move: left, right or forward."}


def play(url: str, number: int) -> list[str]:
    """One episode of ``TURNS`` calls on its whole history; returns the replica that answered each call."""
    with httpx.Client(base_url=url, timeout=120) as http:
        opened = http.post("/v1/episodes", json={"env": "babyai", "task_id": number, "group": "affinity"})
        assert opened.status_code == 201, opened.text
        headers = {"X-Episode-Token": opened.json()["token"]}
        messages = [SYSTEM, {"role": "user", "content": f"Room {number}: you see a red ball to the east."}]
        replicas = []
        for turn in range(TURNS):
            body = {"model": TINY_RANDOM, "messages": messages, "max_tokens": MAX_TOKENS, "seed": 100 * number + turn}
            reply = http.post("/v1/chat/completions", json=body, headers=headers)
            assert reply.status_code == 200, reply.text
            replicas.append(reply.headers["x-replica"])
            messages += [
                {"role": "assistant", "content": reply.json()["choices"][0]["message"]["content"]},
                {"role": "user", "content": f"Room {number}, step {turn}: you moved."},
            ]
        return replicas


def run(affinity: bool) -> tuple[list[list[str]], dict]:
    """Eight episodes at once against two replicas; the replicas of each one's calls, and ``/v1/policy``'s
    per-replica counters once every call is reported."""
    port = free_port()
    config = ServeConfig(
        port=port,
        num_replicas=2,
        num_cpus=0.5,
        torch_threads=1,
        max_tokens=MAX_TOKENS,
        prefix_cache_tokens=8192,
        episode_affinity=affinity,
    )
    start_server(ServeArgs(model=TINY_RANDOM, dtype="float32", serve=config))
    url = f"http://127.0.0.1:{port}"
    try:
        with ThreadPoolExecutor(EPISODES) as pool:
            served = list(pool.map(lambda number: play(url, number), range(EPISODES)))
        for _ in range(100):  # the replicas report after each request, without waiting: read once all arrived
            replicas = httpx.get(f"{url}/v1/policy", timeout=60).json()["replicas"]
            if sum(counters["requests"] for counters in replicas.values()) >= EPISODES * TURNS:
                return served, replicas
        raise AssertionError(f"the replicas reported fewer than {EPISODES * TURNS} requests: {replicas}")
    finally:
        stop_server()


def hit_rate(replicas: dict) -> float:
    reused = sum(counters["reused_tokens"] for counters in replicas.values())
    return reused / (reused + sum(counters["prefill_tokens"] for counters in replicas.values()))


@pytest.mark.slow
@pytest.mark.usefixtures("ray_local")
def test_each_episode_stays_on_one_replica_and_more_of_its_prompts_come_from_cache():
    served, replicas = run(affinity=True)
    assert all(len(set(calls)) == 1 for calls in served), served
    assert {calls[0] for calls in served} == set(replicas) and len(replicas) == 2  # both replicas took episodes
    assert all(0.0 <= counters["prefix_hit_rate"] <= 1.0 for counters in replicas.values())
    spread, spread_replicas = run(affinity=False)
    assert any(len(set(calls)) > 1 for calls in spread), "without affinity some episode should change replica"
    assert hit_rate(replicas) > hit_rate(spread_replicas), (replicas, spread_replicas)

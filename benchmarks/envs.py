"""Env steps per second in-process, through EnvActors, and through the HTTP env server + client.

    python benchmarks/envs.py [--quick] [--envs babyai textcraft]

For every registered env (those that cannot start here are skipped, with the reason), N envs play
their oracle's episodes (a fixed policy: the same actions every run) in lock-step rounds: one call
per env per round, all N at once. The baseline is the same N envs stepped one after another in this
process; the other columns are ratios to it. Resets happen when an episode ends and count toward
the time, not the steps. Everything runs on 127.0.0.1: a local Ray instance and one
``agentgym-rl env-server`` subprocess per env and N. The output ends with one JSON line of every
ratio: ``<env>_actors_vs_in_process_<N>`` and ``<env>_http_vs_in_process_<N>``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
# Run as a script, this file's folder leads sys.path and this file would shadow the `envs` package.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import httpx
import ray

from agentgym_rl import envs
from agentgym_rl.envs.actor import create_env_actor
from agentgym_rl.envs.base import EnvError, TextEnv
from agentgym_rl.envs.http import AgentGymClient

# Each SciWorld instance is a JVM: more than 8 at once would only measure this machine's memory,
# and --quick cannot afford to start 8 of them three times.
LIMITS = {"sciworld": 8}
QUICK_LIMITS = {"sciworld": 1}
SCRIPTED_TASKS = 4

Call = tuple[str, Any]  # ("reset", task_id) or ("step", reply)


class Player:
    """Walks one env through the scripted episodes, one call at a time, looping over the tasks."""

    def __init__(self, scripts: dict[int, list[str]], offset: int) -> None:
        self.episodes = list(scripts.items())
        self.episode = offset % len(self.episodes)
        self.turn = -1  # -1: the next call is the reset
        self.steps = 0

    def next_call(self) -> Call:
        task, actions = self.episodes[self.episode]
        return ("reset", task) if self.turn < 0 else ("step", actions[self.turn])

    def feed(self, result: Any) -> None:
        _task, actions = self.episodes[self.episode]
        if self.turn >= 0:
            self.steps += 1
        self.turn += 1
        ended = self.turn > 0 and (result.done or self.turn >= len(actions))
        if ended:
            self.episode, self.turn = (self.episode + 1) % len(self.episodes), -1


def oracle_scripts(env: TextEnv) -> dict[int, list[str]]:
    """Oracle replies for the first test tasks the oracle can solve (bare actions gain an ``Action:`` line)."""
    scripts: dict[int, list[str]] = {}
    for task in list(env.tasks("test"))[: SCRIPTED_TASKS * 3]:
        try:
            actions = env.oracle_episode(task) if hasattr(env, "oracle_episode") else env.oracle_actions(task)
        except EnvError:
            continue  # the oracle cannot solve every task (BabyAI's KeyInBox); another one is taken
        scripts[task] = [a if isinstance(env.parse_action(a), str) else f"Action: {a}" for a in actions]
        if len(scripts) == SCRIPTED_TASKS:
            break
    if not scripts:
        raise EnvError("its oracle solved none of the first test tasks")
    return scripts


def measure(players: list[Player], run_round: Callable[[list[Call]], list[Any]], seconds: float) -> float:
    """Steps per second of lock-step rounds over ``players`` during about ``seconds``."""
    # Warm-up (a fifth of the time, at least one round): first resets, imports, connections, a JVM's JIT.
    warm_until = time.perf_counter() + seconds / 5
    while True:
        for player, result in zip(players, run_round([p.next_call() for p in players]), strict=True):
            player.feed(result)
        if time.perf_counter() >= warm_until:
            break
    start_steps = sum(p.steps for p in players)
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for player, result in zip(players, run_round([p.next_call() for p in players]), strict=True):
            player.feed(result)
    return (sum(p.steps for p in players) - start_steps) / (time.perf_counter() - start)


def call(env: Any, kind_arg: Call) -> Any:
    kind, arg = kind_arg
    return getattr(env, kind)(arg)


def in_process(name: str, scripts: dict[int, list[str]], counts: list[int], seconds: float) -> dict[int, float]:
    instances = [envs.make(name) for _ in range(max(counts))]
    try:
        rates = {}
        for n in counts:
            players, chosen = [Player(scripts, i) for i in range(n)], instances[:n]
            rates[n] = measure(
                players, lambda calls, c=chosen: [call(e, x) for e, x in zip(c, calls, strict=True)], seconds
            )
        return rates
    finally:
        for env in instances:
            env.close()


def through_actors(name: str, scripts: dict[int, list[str]], counts: list[int], seconds: float) -> dict[int, float]:
    actors = [create_env_actor(name, None, num_cpus=0.01) for _ in range(max(counts))]
    try:
        ray.get([a.health.remote() for a in actors])  # started before the clock runs

        # The first len(calls) actors play: calls come from the N players of this measurement.
        def run_round(calls: list[Call]) -> list[Any]:
            return ray.get([getattr(a, kind).remote(arg) for a, (kind, arg) in zip(actors, calls, strict=False)])

        return {n: measure([Player(scripts, i) for i in range(n)], run_round, seconds) for n in counts}
    finally:
        for actor in actors:
            ray.kill(actor)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def through_http(name: str, scripts: dict[int, list[str]], counts: list[int], seconds: float) -> dict[int, float]:
    """One env server subprocess for the env; N clients, each stepping from its own thread."""
    port, most = free_port(), max(counts)
    cmd = [sys.executable, "-m", "agentgym_rl.envs.http", name, "--port", str(port), "--max-envs", str(most)]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(url, timeout=1).raise_for_status()
                break
            except httpx.HTTPError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise EnvError(f"env-server did not start: {server.stderr.read().decode()[-500:]}") from None
                time.sleep(0.1)
        clients = [AgentGymClient(base_url=url, env_name=name) for _ in range(most)]
        try:
            with ThreadPoolExecutor(max_workers=most) as pool:
                return {
                    n: measure(
                        [Player(scripts, i) for i in range(n)],
                        lambda calls: list(pool.map(call, clients, calls)),
                        seconds,
                    )
                    for n in counts
                }
        finally:
            for client in clients:
                client.close()
    finally:
        server.terminate()
        server.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 and 8 envs, 1 s per measurement (about a minute)")
    parser.add_argument("--envs", nargs="*", default=None, help="env names (default: every registered env)")
    args = parser.parse_args()
    concurrency = [1, 8] if args.quick else [1, 8, 32]
    limits = QUICK_LIMITS if args.quick else LIMITS
    seconds = 1.0 if args.quick else 3.0
    names = args.envs or [n for n in envs.names() if n != "agentgym-remote"]  # the client is the HTTP column
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    print(f"{'env':<10} {'envs':>4} {'in-process steps/s':>19} {'EnvActors':>10} {'HTTP':>8}")
    started = time.perf_counter()
    ratios: dict[str, float] = {}
    for name in names:
        try:
            probe = envs.make(name)
            scripts = oracle_scripts(probe)
            probe.close()
        except Exception as exc:  # noqa: BLE001 -- any failure to start means: skip this env and say why
            print(f"{name:<10} skipped: {type(exc).__name__}: {str(exc).splitlines()[0][:150]}")
            continue
        counts = [n for n in concurrency if n <= limits.get(name, n)]
        try:
            base = in_process(name, scripts, counts, seconds)
            actors = through_actors(name, scripts, counts, seconds)
            http = through_http(name, scripts, counts, seconds)
        except Exception as exc:  # noqa: BLE001 -- a failure mid-run (a JVM that died) costs this env's rows, not the table
            print(f"{name:<10} failed: {type(exc).__name__}: {str(exc).splitlines()[0][:150]}")
            continue
        for n in counts:
            print(f"{name:<10} {n:>4} {base[n]:>19.1f} {actors[n] / base[n]:>9.2f}x {http[n] / base[n]:>7.2f}x")
            ratios[f"{name}_actors_vs_in_process_{n}"] = round(actors[n] / base[n], 4)
            ratios[f"{name}_http_vs_in_process_{n}"] = round(http[n] / base[n], 4)
        if len(counts) < len(concurrency):
            print(f"{name:<10} more than {counts[-1]} envs skipped: {'one JVM per SciWorld instance'}")
    print(f"(ratios to in-process with the same number of envs; {time.perf_counter() - started:.0f} s in all)")
    ray.shutdown()
    print(json.dumps({"ratios": ratios}))


if __name__ == "__main__":
    main()

"""An agent that knows nothing of agentgym-rl: it plays BabyAI through an AgentGym-protocol env server with the
plain `openai` client (and `requests`), and lets the policy endpoint record each game as an episode, closed
with the env's reward. A run in `trainer.mode: gateway` behind that endpoint learns from the games.

    python docs/examples/gateway_agent.py --policy http://127.0.0.1:8000 --env http://127.0.0.1:36001 \\
        --model smollm2-135m-instruct --tasks 0 1 2 3 --group-size 2 --rounds 3

Each round plays every task `--group-size` times (with `--tasks-per-round K`, the next K of `--tasks`,
wrapping around); the games of one task share a group key, which group algorithms (GRPO, RLOO) compare.
`--system-file` replaces the agent's short system prompt with the text of a file. `--transcripts FILE` appends one JSON line per game: what the agent sent and
received, with the log-probabilities the endpoint returned.

Without `--policy` and `--env` it starts both itself, for the length of the script: `agentgym-rl env-server
babyai` and a two-iteration gateway run on tiny-random (`agentgym-rl train --set trainer.mode=gateway ...`,
run directory under `--run-dir`). It plays until the run has trained twice, then checks what the run trained
on: every reply the agent received, with the same log-probabilities, and the weights version advancing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import requests

# Longest wait for one answer of the endpoint or the env server: on a busy CPU machine (a training run beside the
# endpoint, other jobs on its cores) one can take well over half a minute.
HTTP_TIMEOUT_S = 300.0

SYSTEM = (
    "You are an agent in a grid world. Each message describes what you see. Reply with exactly one action, "
    "such as 'turn left', 'turn right', 'move forward', 'go to <object>' or 'pickup <object>'."
)


def play(args: argparse.Namespace, task_id: int, group: str, seed: int) -> dict:
    """One game of ``task_id`` as one episode; returns its transcript and the endpoint's final account."""
    episode, headers, env_id, observation = open_game(args, task_id, group)
    client = openai.OpenAI(base_url=f"{args.policy}/v1", api_key="unused", max_retries=3)
    messages = [{"role": "system", "content": args.system}, {"role": "user", "content": observation["observation"]}]
    replies, reward = [], 0.0
    for turn in range(args.turns):
        completion = client.chat.completions.create(
            model=args.model,
            messages=messages,
            max_tokens=args.max_tokens,
            temperature=1.0,
            seed=seed * 1000 + turn,
            logprobs=True,
            extra_headers=headers,
        )
        action = completion.choices[0].message.content
        replies.append(
            {"text": action, "logprobs": [entry.logprob for entry in completion.choices[0].logprobs.content]}
        )
        step = requests.post(f"{args.env}/step", json={"id": env_id, "action": action}, timeout=HTTP_TIMEOUT_S).json()
        reward = float(step["reward"])
        messages += [{"role": "assistant", "content": action}, {"role": "user", "content": step["observation"]}]
        if step["done"]:
            break
    return close_game(args, episode, env_id, reward, task_id=task_id, group=group, replies=replies)


def open_game(args: argparse.Namespace, task_id: int, group: str) -> tuple[dict, dict, int, dict]:
    """An episode of the endpoint and a game of ``task_id`` on the env server: the episode, the headers that tag
    the game's model calls, the game's id and its first observation."""
    episode = requests.post(
        f"{args.policy}/v1/episodes", json={"env": "babyai", "task_id": task_id, "group": group}, timeout=HTTP_TIMEOUT_S
    ).json()
    env_id = requests.post(f"{args.env}/create", timeout=HTTP_TIMEOUT_S).json()["id"]
    observation = requests.post(
        f"{args.env}/reset", json={"id": env_id, "data_idx": task_id}, timeout=HTTP_TIMEOUT_S
    ).json()
    return episode, {"X-Episode-Token": episode["token"]}, env_id, observation


def close_game(args: argparse.Namespace, episode: dict, env_id: int, reward: float, **game) -> dict:
    """Close game ``env_id`` and its episode with ``reward``; returns the game's record: ``game``, the episode
    and the endpoint's final account."""
    requests.post(f"{args.env}/close", json={"id": env_id}, timeout=HTTP_TIMEOUT_S)
    closed = requests.post(
        f"{args.policy}/v1/episodes/{episode['id']}/reward",
        json={"reward": reward},
        headers={"X-Episode-Token": episode["token"]},
        timeout=HTTP_TIMEOUT_S,
    ).json()
    return {**game, "episode": episode["id"], "token": episode["token"], "account": closed}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Started:
    """A process this script started, with its output in a temporary file."""

    def __init__(self, process: subprocess.Popen, log) -> None:
        self.process, self.log = process, log

    def tail(self) -> str:
        self.log.seek(0)
        return self.log.read()[-3000:]


@contextlib.contextmanager
def started(command: list[str], ready_url: str) -> Iterator[Started]:
    """Run ``command`` until the block ends; enter once ``ready_url`` answers 200."""
    with tempfile.TemporaryFile(mode="w+") as log:
        run = Started(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True), log)
        try:
            deadline = time.monotonic() + 600
            while True:
                if run.process.poll() is not None:
                    raise RuntimeError(f"{command[1]} exited with {run.process.returncode}: {run.tail()}")
                with contextlib.suppress(requests.RequestException):
                    if requests.get(ready_url, timeout=5).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{ready_url} did not answer within 600 s")
                time.sleep(2)
            yield run
        finally:
            if run.process.poll() is None:
                run.process.terminate()
            run.process.wait(timeout=120)


def round_tasks(args: argparse.Namespace, round_: int) -> list[int]:
    """The tasks round ``round_`` plays: all of ``--tasks``, or the next ``--tasks-per-round`` of them."""
    per_round = args.tasks_per_round or len(args.tasks)
    return [args.tasks[(round_ * per_round + i) % len(args.tasks)] for i in range(per_round)]


Play = Callable[[argparse.Namespace, int, str, int], dict]  # (args, task id, group key, seed) -> the game


def play_rounds(args: argparse.Namespace, play: Play, first_round: int = 0, rounds: int | None = None) -> list[dict]:
    games = [
        (task, f"round{r}-task{task}", (r * len(tasks) + i) * args.group_size + k)
        for r in range(first_round, first_round + (rounds or args.rounds))
        for tasks in [round_tasks(args, r)]
        for i, task in enumerate(tasks)
        for k in range(args.group_size)
    ]
    with ThreadPoolExecutor(args.parallel) as pool:
        return list(pool.map(lambda game: play(args, *game), games))


def weights_version(args: argparse.Namespace) -> int:
    return requests.get(f"{args.policy}/v1/policy", timeout=HTTP_TIMEOUT_S).json()["weights_version"]


def taken_for_training(args: argparse.Namespace, game: dict) -> bool:
    """Whether the run has taken ``game``'s episode (the endpoint no longer holds it: 404)."""
    headers = {"X-Episode-Token": game["token"]}
    return (
        requests.get(
            f"{args.policy}/v1/episodes/{game['episode']}", headers=headers, timeout=HTTP_TIMEOUT_S
        ).status_code
        == 404
    )


def play_paced(args: argparse.Namespace, play: Play) -> list[dict]:
    """One round at a time, each once the run has taken every game of the round before for training, or serves
    newer weights (an iteration whose games all won or all lost trains nothing and publishes no weights)."""
    results = []
    for round_ in range(args.rounds):
        version = weights_version(args)
        played = play_rounds(args, play, first_round=round_, rounds=1)
        results += played
        wins = sum(result["account"]["reward"] > 0 for result in played)
        print(f"round {round_}: weights version {version}, {wins} of {len(played)} games won", flush=True)
        deadline = time.monotonic() + args.wait_s
        while round_ + 1 < args.rounds and weights_version(args) <= version:
            if all(taken_for_training(args, game) for game in played):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"the run took none of round {round_}'s games for {args.wait_s:g} s")
            time.sleep(2)
    return results


def trained_trajectories(run: Path) -> list[tuple[str, dict]]:
    """The trajectories the run trained on, with their file's name, once it has trained and published twice."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["weights_version"] for r in records] == [1, 2], "each iteration should train and publish once"
    files = sorted((run / "trajectories").glob("*.jsonl"))
    trained = [(path.name, json.loads(line)) for path in files for line in path.open()]
    assert trained, "the run wrote no trajectories"
    return trained


def check_the_run_trained_on_these_games(run: Path, results: list[dict], group_size: int) -> None:
    """Every trajectory the run trained on is one of the agent's games: the replies it received, with the log-
    probabilities the endpoint returned for them (the stop token, which has no text, aside), in groups of
    ``group_size`` games of one task."""
    trained = trained_trajectories(run)
    games = {tuple(reply["text"] for reply in result["replies"]): result for result in results}
    groups: dict[tuple[str, int], list[dict]] = {}
    for name, trajectory in trained:
        groups.setdefault((name, trajectory["group"]), []).append(games[tuple(trajectory["actions"])])
    # each group the run formed holds group-size games of one task, all with the same group key
    assert all(len(members) == len({m["episode"] for m in members}) for members in groups.values())
    assert all(len({(m["task_id"], m["group"]) for m in members}) == 1 for members in groups.values())
    assert {len(members) for members in groups.values()} == {group_size}
    for _, trajectory in trained:
        game = games[tuple(trajectory["actions"])]
        for (start, end), reply in zip(trajectory["turn_spans"], game["replies"], strict=True):
            sampled = trajectory["logprobs"][start:end][: len(reply["logprobs"])]
            assert all(abs(a - b) < 1e-6 for a, b in zip(sampled, reply["logprobs"], strict=True))
    print(f"the run trained on {len(trained)} of the agent's games over 2 iterations")


def build_parser(doc: str) -> argparse.ArgumentParser:
    """The options of an agent script whose module docstring is ``doc``."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--policy", help="the policy endpoint (default: start a gateway run on tiny-random)")
    parser.add_argument("--env", help="a BabyAI env server, AgentGym protocol (default: start one)")
    parser.add_argument("--model", help="the served model id (default: the endpoint's only model)")
    parser.add_argument("--tasks", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--tasks-per-round", type=int, help="play the next K of --tasks each round (default: all)")
    parser.add_argument("--group-size", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--parallel", type=int, default=4, help="games played at once")
    parser.add_argument("--system-file", help="a file holding the system prompt (default: a short one of its own)")
    parser.add_argument(
        "--paced",
        action="store_true",
        help="play one round at a time, each once the run has taken the round before for training",
    )
    parser.add_argument("--wait-s", type=float, default=1800.0, help="--paced: longest wait for the run")
    parser.add_argument("--transcripts", help="append one JSON line per game to this file")
    parser.add_argument("--run-dir", help="where the started gateway run writes (default: a temporary folder)")
    return parser


Check = Callable[[Path, list[dict], int], None]  # (run directory, games, group size): raises if the run is wrong


def run_agent(args: argparse.Namespace, play: Play, check: Check, extra_settings: tuple[str, ...] = ()) -> None:
    """Play ``args``' rounds with ``play``; without ``--policy``/``--env``, start them (the gateway run on
    tiny-random with ``extra_settings``) and ``check`` what the run trained on."""
    with contextlib.ExitStack() as stack:
        cli = str(Path(sys.executable).parent / "agentgym-rl")
        if args.env is None:
            port = free_port()
            stack.enter_context(
                started([cli, "env-server", "babyai", "--port", str(port)], f"http://127.0.0.1:{port}/openapi.json")
            )
            args.env = f"http://127.0.0.1:{port}"
        run = None
        if args.policy is None:
            port = free_port()
            runs = Path(args.run_dir or stack.enter_context(tempfile.TemporaryDirectory()))
            settings = [
                *extra_settings,
                "model.name=tiny-random",
                "model.adapter=null",
                "trainer.mode=gateway",
                "serve.enabled=true",
                f"serve.port={port}",
                "trainer.iterations=2",
                f"trainer.tasks_per_iteration={len(args.tasks)}",
                f"algorithm.group_size={args.group_size}",
                "algorithm.skip_uniform_groups=false",  # tiny-random never wins: every group is uniform
                "logging.progress=false",
                f"run.dir={runs}",
                "run.name=gateway",
            ]
            command = [cli, "train", *(item for setting in settings for item in ("--set", setting))]
            trainer = stack.enter_context(started(command, f"http://127.0.0.1:{port}/healthz"))
            args.policy, run = f"http://127.0.0.1:{port}", runs / "gateway"
        if args.model is None:
            [args.model] = [
                model["id"] for model in requests.get(f"{args.policy}/v1/models", timeout=HTTP_TIMEOUT_S).json()["data"]
            ]
        results = play_paced(args, play) if args.paced else play_rounds(args, play)
        if run is not None:  # a round per iteration, until the run has trained twice
            results += play_rounds(args, play, first_round=args.rounds)
            trainer.process.wait(timeout=900)
            assert trainer.process.returncode == 0, trainer.tail()
            check(run, results, args.group_size)
    if args.transcripts:
        with open(args.transcripts, "a") as out:
            out.writelines(json.dumps({k: v for k, v in result.items() if k != "token"}) + "\n" for result in results)
    wins = sum(result["account"]["reward"] > 0 for result in results)
    print(f"played {len(results)} games, {wins} won")


def main(doc: str, system: str, play: Play, check: Check) -> None:
    """An agent script's entry point: its options (``doc``: its docstring), its default system prompt."""
    args = build_parser(doc).parse_args()
    args.system = Path(args.system_file).read_text().strip() if args.system_file else system
    run_agent(args, play, check)


if __name__ == "__main__":
    main(__doc__, SYSTEM, play, check_the_run_trained_on_these_games)

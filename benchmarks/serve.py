"""Served chat completions against the bare engine, at 1, 8 and 32 concurrent clients.

    python benchmarks/serve.py [--quick] [--model tiny-random] [--torch-threads N]

A local Ray instance serves the model (``tiny-random`` unless ``--model`` names another) on 127.0.0.1
(Serve's HTTP proxy and one model replica answering HTTP itself, with continuous batching; the
replica's torch threads are ``serve.torch_threads``, ``--torch-threads``). C clients
each send chat completions back to back (temperature 1, a fixed ``max_tokens``) until a request count
or a time budget runs out; the table reports requests/s, generated tokens/s, p50/p99 latency, failed
requests, and the ratio of served tokens/s to the same engine's tokens/s when this process calls
``generate`` directly on batches of C prompts (no HTTP, no scheduling: the ceiling). The last line is
JSON:
``{"ratios": {"served_vs_engine_c1": ..., "served_vs_engine_c8": ..., "served_vs_engine_c32": ...,
"recorded_vs_plain_c8": ..., "recorded_vs_plain_c32": ...}, "errors": N}``.

The ``recorded_vs_plain`` rows measure what recording episodes costs: C clients play two-turn
conversations for half the time budget, each conversation an episode (opened, both calls tagged with its
token, its reward posted) or plain calls with the same messages; the ratio is recorded over plain
generated tokens/s, the plain runs made before and after the recorded one and averaged.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import sys
import time

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
# Run as a script, this file's folder leads sys.path and could shadow the `serve` package.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import httpx
import torch

from agentgym_rl.actors.chat import ChatFormat
from agentgym_rl.actors.cluster import init_ray
from agentgym_rl.actors.engines import make_engine
from agentgym_rl.actors.model_store import load_tokenizer
from agentgym_rl.configs import Config
from agentgym_rl.configs.schema import SamplingConfig, ServeConfig
from agentgym_rl.serve.app import ServeArgs, start_server, stop_server

DTYPE = "auto"  # the server's default; the bare engine computes in the same dtype
MESSAGES = [{"role": "user", "content": "Go to the red ball. What is your next action?"}]
CONCURRENCY = (1, 8, 32)
RECORDED_CONCURRENCY = (8, 32)  # clients for the episode-recording rows
# tiny-random's p99 latency before continuous batching (static `serve.batch` batches, README of that version).
P99_MS_BEFORE = {"tiny-random": {1: 2449.0, 8: 16987.0, 32: 40402.0}}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def load_test(
    url: str, model: str, clients: int, requests: int, budget_s: float, max_tokens: int
) -> dict[str, float]:
    """C clients send requests back to back until ``requests`` are done or ``budget_s`` has passed."""
    body = {"model": model, "messages": MESSAGES, "max_tokens": max_tokens}
    latencies: list[float] = []
    tokens = 0
    issued = 0
    errors: list[str] = []
    deadline = time.perf_counter() + budget_s

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal tokens, issued
        while issued < requests and time.perf_counter() < deadline:
            issued += 1
            started = time.perf_counter()
            try:
                response = await http.post(url + "/v1/chat/completions", json=body)
            except httpx.HTTPError as exc:
                errors.append(repr(exc))
                continue
            if response.status_code != 200:
                errors.append(f"{response.status_code}: {response.text[:200]}")
                continue
            latencies.append(time.perf_counter() - started)
            tokens += response.json()["usage"]["completion_tokens"]

    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(timeout=300, limits=limits) as http:
        started = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        elapsed = time.perf_counter() - started
    for error in errors[:5]:
        print(f"  error at {clients} clients: {error}", file=sys.stderr)
    return {
        "requests": len(latencies),
        "errors": len(errors),
        "req_s": len(latencies) / elapsed,
        "tok_s": tokens / elapsed,
        "p50_ms": 1000 * statistics.median(latencies) if latencies else float("nan"),
        "p99_ms": 1000 * percentile(latencies, 0.99) if latencies else float("nan"),
    }


async def conversation_load_test(
    url: str, model: str, clients: int, budget_s: float, max_tokens: int, *, record: bool
) -> float:
    """Generated tokens/s of C clients each playing two-turn conversations back to back for ``budget_s``;
    with ``record``, each conversation is an episode (opened, its calls tagged, its reward posted), whose
    requests count in the time too."""
    tokens = 0
    deadline = time.perf_counter() + budget_s

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal tokens
        while time.perf_counter() < deadline:
            headers = {}
            if record:
                opened = (await http.post(url + "/v1/episodes", json={"group": "bench"})).json()
                headers = {"X-Episode-Token": opened["token"]}
            messages = list(MESSAGES)
            for _ in range(2):
                body = {"model": model, "messages": messages, "max_tokens": max_tokens}
                reply = (await http.post(url + "/v1/chat/completions", json=body, headers=headers)).json()
                tokens += reply["usage"]["completion_tokens"]
                text = reply["choices"][0]["message"]["content"]
                messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "What next?"}]
            if record:
                await http.post(f"{url}/v1/episodes/{opened['id']}/reward", json={"reward": 0.0}, headers=headers)

    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=clients)) as http:
        started = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(clients)))
        return tokens / (time.perf_counter() - started)


def bare_engine_tokens_per_s(model: str, batch: int, rounds: int, max_tokens: int) -> float:
    """Tokens/s of ``generate`` on batches of ``batch`` copies of the benchmark prompt, in this process."""
    tokenizer = load_tokenizer(model)
    prompt = ChatFormat(tokenizer).prompt_ids(MESSAGES)
    engine = make_engine(
        "transformers",
        model_name=model,
        dtype=DTYPE,
        seed=0,
        stop_token_ids=[tokenizer.eos_token_id],
        pad_token_id=tokenizer.pad_token_id,
    )
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=max_tokens)
    engine.generate([prompt] * batch, sampling)  # warm-up
    tokens = 0
    started = time.perf_counter()
    for _ in range(rounds):
        tokens += sum(len(g.token_ids) for g in engine.generate([prompt] * batch, sampling))
    return tokens / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer requests and a shorter budget (about a minute)")
    parser.add_argument("--model", default="tiny-random", help="built-in model name or model directory")
    parser.add_argument(
        "--torch-threads", type=int, default=None, help="serve.torch_threads of the replica (default: the server's)"
    )
    args = parser.parse_args()
    model = args.model
    requests, budget_s, rounds, max_tokens = (48, 15.0, 2, 16) if args.quick else (256, 60.0, 5, 32)

    init_ray(Config.model_validate({"ray": {"num_cpus": 2}}))
    # Measured before and after serving and averaged: on a shared machine the load drifts during a run.
    bare_before = {c: bare_engine_tokens_per_s(model, c, rounds, max_tokens) for c in CONCURRENCY}
    port = free_port()
    config = ServeConfig(port=port, max_batch_size=32, max_tokens=max_tokens, torch_threads=args.torch_threads)
    start_server(ServeArgs(model=model, dtype=DTYPE, serve=config))
    url = f"http://127.0.0.1:{port}"
    try:
        asyncio.run(load_test(url, model, 4, 8, 30.0, max_tokens))  # warm-up: replica threads, proxy routes
        threads = httpx.get(url + "/v1/policy").json()["torch_threads"]  # what the replica resolved
        served = {c: asyncio.run(load_test(url, model, c, requests, budget_s, max_tokens)) for c in CONCURRENCY}
        # Episode recording on against off, the plain runs before and after the recorded one (drift).
        recording = {}
        for c in RECORDED_CONCURRENCY:
            plain = [asyncio.run(conversation_load_test(url, model, c, budget_s / 2, max_tokens, record=False))]
            recorded = asyncio.run(conversation_load_test(url, model, c, budget_s / 2, max_tokens, record=True))
            plain.append(asyncio.run(conversation_load_test(url, model, c, budget_s / 2, max_tokens, record=False)))
            recording[c] = (statistics.mean(plain), recorded)
    finally:
        stop_server()
    bare = {c: (bare_before[c] + bare_engine_tokens_per_s(model, c, rounds, max_tokens)) / 2 for c in CONCURRENCY}
    before = P99_MS_BEFORE.get(model, {c: float("nan") for c in CONCURRENCY})  # nan: never measured

    print(
        f"\nserve benchmark: {model}, max_tokens={max_tokens}, 127.0.0.1, one replica (continuous batching, 32 rows, "
        f"torch threads {threads}; the bare engine: {torch.get_num_threads()})"
    )
    header = f"{'clients':>7} {'requests':>8} {'errors':>6} {'req/s':>8} {'tok/s':>8} {'p50 ms':>8} {'p99 ms':>8}"
    print(header + f" {'p99 before':>10} {'engine tok/s':>12} {'served/engine':>13}")
    for c in CONCURRENCY:
        row = served[c]
        print(
            f"{c:>7} {row['requests']:>8} {row['errors']:>6} {row['req_s']:>8.1f} {row['tok_s']:>8.1f} "
            f"{row['p50_ms']:>8.1f} {row['p99_ms']:>8.1f} {before[c]:>10.0f} {bare[c]:>12.1f} "
            f"{row['tok_s'] / bare[c]:>13.2f}"
        )
    print("engine tok/s: the same engine's generate() on batches of <clients> prompts in this process (mean of a")
    print("measurement before and one after the served runs); served/engine = served tok/s / engine tok/s;")
    print("p99 before: the same benchmark before continuous batching (static batches), from the previous README.")
    print(f"p99 latency at 32 clients: {served[32]['p99_ms']:.0f} ms (before continuous batching: {before[32]:.0f} ms)")
    print("\nepisode recording: two-turn conversations, each an episode (opened, calls tagged, reward posted) or not")
    print(f"{'clients':>7} {'plain tok/s':>11} {'recorded tok/s':>14} {'recorded/plain':>14}")
    for c, (plain, recorded) in recording.items():
        print(f"{c:>7} {plain:>11.1f} {recorded:>14.1f} {recorded / plain:>14.2f}")
    ratios = {f"served_vs_engine_c{c}": round(served[c]["tok_s"] / bare[c], 4) for c in CONCURRENCY}
    ratios |= {f"recorded_vs_plain_c{c}": round(recorded / plain, 4) for c, (plain, recorded) in recording.items()}
    print(json.dumps({"ratios": ratios, "errors": sum(served[c]["errors"] for c in CONCURRENCY)}))


if __name__ == "__main__":
    main()

"""Torch threads on cores that several processes share: what ``AGENTGYM_RL_TORCH_THREADS`` is for.

    python benchmarks/shared_cores.py [--quick] [--processes 4] [--threads N ...] [--steps 3000]

Each process runs the same small matrix products a decode step of a small model does (8 rows through a
576 x 1536 projection, and a 256 x 256 product), ``--steps`` times, with a given number of torch threads. Rows:

* ``alone``: one process, each thread count in turn (the baseline: the machine to itself);
* ``shared``: ``--processes`` processes at once, each with that thread count.

``slowdown`` is a process's seconds when shared (the median of them) over one process's seconds alone with
every core (what an actor takes by default on a CPU-only node); at ``--processes`` / cores the shared machine
loses nothing to waiting. The ``ratios`` line holds ``shared_<N>_threads_vs_every_core``: the shared row's
median seconds with N threads over those with every core (< 1: capping the threads at N pays).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path


def work(threads: int, steps: int) -> float:
    """Seconds for ``steps`` steps on ``threads`` torch threads (run in a process of its own)."""
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    rows, weight = torch.randn(8, 576), torch.randn(576, 1536)
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    started = time.perf_counter()
    for _ in range(steps):
        (rows @ weight).relu_()
        a @ b
    return time.perf_counter() - started


def machine() -> dict:
    """The CPU's model name and family (from /proc/cpuinfo where there is one) and its core count."""
    fields: dict[str, str] = {}
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name") or platform.machine()
    return {"cpu": name, "family": fields.get("cpu family"), "cores": os.cpu_count() or 1}


def run(processes: int, threads: int, steps: int) -> list[float]:
    """Each process's seconds, with ``processes`` of them started at once."""
    command = [sys.executable, __file__, "--worker", str(threads), "--steps", str(steps)]
    started = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True) for _ in range(processes)]
    return [float(process.communicate()[0]) for process in started]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--threads", type=int, nargs="+", default=[os.cpu_count() or 1, 1])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--quick", action="store_true", help="600 steps")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(work(args.worker, args.steps))
        return
    steps = 600 if args.quick else args.steps
    cores = os.cpu_count() or 1
    print(json.dumps({"machine": machine(), "steps": steps}))
    alone = {threads: run(1, threads, steps)[0] for threads in sorted(set(args.threads) | {cores})}
    for threads, seconds in alone.items():
        print(f"alone, {threads} threads: {seconds:.2f} s")
    shared = {}
    for threads in sorted(set(args.threads) | {cores}):
        seconds = run(args.processes, threads, steps)
        shared[threads] = statistics.median(seconds)
        each = ", ".join(f"{s:.2f}" for s in seconds)
        print(
            f"shared by {args.processes} processes, {threads} threads each: {each} s "
            f"(slowdown {shared[threads] / alone[cores]:.1f}x)"
        )
    ratios = {f"shared_{t}_threads_vs_every_core": round(shared[t] / shared[cores], 3) for t in shared if t != cores}
    print(json.dumps({"ratios": ratios}))


if __name__ == "__main__":
    main()

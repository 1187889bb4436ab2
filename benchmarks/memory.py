"""Peak memory of a whole run: the command's process tree (the driver, Ray's GCS and raylet, every actor)
sampled while it runs, against a budget.

    python benchmarks/memory.py [--budget-gib 8] [--interval 0.5] [--quick]

Runs ``agentgym-rl train configs/warm_start_grpo.yaml`` on its defaults, shortened so that every phase is
reached at its largest (the SFT warm start for 2 iterations, then 2 GRPO iterations at the recipe's
longest horizon, 10 turns; ``--quick``: 1 and 1), and samples every process below it. Two sums are
printed per phase and at the peak:

* PSS (proportional set size, ``/proc/PID/smaps_rollup``): each shared page (torch's libraries, Ray's
  object store) divided among the processes that map it, so the sum is the memory the run occupies;
* RSS: each process's resident pages counted in full, which counts shared pages once per process and
  overstates the run.

``peak_pss_vs_budget`` is the peak PSS sum over the budget (<= 1: the run fits).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

import psutil

REPO = Path(__file__).resolve().parents[1]
GIB = 1024**3


class Sample(NamedTuple):
    pss: int
    rss: int
    by_name: dict[str, int]  # PSS per process title (Ray names its workers ``ray::ActorClass``)


def tree_memory(root: psutil.Process) -> Sample:
    """PSS and RSS sums over ``root`` and its descendants, with PSS per process title; processes that end
    while being read are left out."""
    pss = rss = 0
    by_name: dict[str, int] = defaultdict(int)
    for process in [root, *root.children(recursive=True)]:
        try:
            info = process.memory_full_info()
            name = process.cmdline()[0] if process.cmdline() else process.name()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        pss += info.pss
        rss += info.rss
        by_name[Path(name.split(" ")[0]).name] += info.pss
    return Sample(pss, rss, dict(by_name))


def phase(run_dir: Path, warm_iterations: int) -> str:
    """What the run is doing, read from its directory: the warm start until its final checkpoint, then GRPO."""
    warm = run_dir / "warm_start"
    if (warm / "checkpoints" / f"iter_{warm_iterations:06d}").is_dir():
        return "grpo"
    return "warm start" if warm.is_dir() else "start-up"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-gib", type=float, default=8.0, help="the budget the peak is compared with")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between samples")
    parser.add_argument("--quick", action="store_true", help="1 warm-start and 1 GRPO iteration")
    args = parser.parse_args()
    iterations = 1 if args.quick else 2
    with tempfile.TemporaryDirectory() as root:
        sets = [
            f"warm_start.iterations={iterations}",
            f"trainer.iterations={iterations}",
            "curriculum.schedule=fixed",
            "curriculum.horizon=10",
            "logging.progress=false",
            f"run.dir={root}",
            "run.name=memory",
        ]
        command = [sys.executable, "-m", "agentgym_rl.driver.cli", "train", "configs/warm_start_grpo.yaml"]
        command += [a for s in sets for a in ("--set", s)]
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        started = time.perf_counter()
        with open(Path(root) / "train.log", "w") as log:
            child = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        peaks: dict[str, Sample] = {}
        stop = threading.Event()

        def sample() -> None:
            process = psutil.Process(child.pid)
            while not stop.is_set():
                sample = tree_memory(process)
                now = phase(Path(root) / "memory", iterations)
                if now not in peaks or sample.pss > peaks[now].pss:
                    peaks[now] = sample
                stop.wait(args.interval)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        code = child.wait()
        stop.set()
        sampler.join()
        if code != 0:
            tail = (Path(root) / "train.log").read_text()[-3000:]
            raise SystemExit(f"the run failed (exit {code}):\n{tail}")
    print(
        f"agentgym-rl train configs/warm_start_grpo.yaml, {iterations} warm-start + {iterations} GRPO iterations at "
        f"horizon 10, {time.perf_counter() - started:.0f} s; sampled every {args.interval:g} s"
    )
    print(f"{'phase':<12} {'peak PSS GiB':>12} {'RSS GiB':>8}  PSS GiB by process at that moment")
    for name, sample in peaks.items():
        parts = sorted(sample.by_name.items(), key=lambda item: -item[1])
        shares = ", ".join(f"{title} {pss / GIB:.2f}" for title, pss in parts if pss >= GIB / 20)
        print(f"{name:<12} {sample.pss / GIB:>12.2f} {sample.rss / GIB:>8.2f}  {shares}")
    peak = max(sample.pss for sample in peaks.values())
    print(f"peak PSS {peak / GIB:.2f} GiB of a {args.budget_gib:g} GiB budget")
    print(json.dumps({"ratios": {"peak_pss_vs_budget": round(peak / (args.budget_gib * GIB), 4)}}))


if __name__ == "__main__":
    main()

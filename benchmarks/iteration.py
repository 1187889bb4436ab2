"""A whole GRPO iteration of the full-weights recipe, new defaults / previous defaults, in wall time (goal <= 1/3).

    python benchmarks/iteration.py [--quick] [--model smollm2-135m-instruct] [--horizon 6] [--iterations N]

Two ``agentgym-rl train configs/warm_start_grpo.yaml`` runs, one after the other, on the same tasks with the
same seeds (``run.seed`` 0) and the same horizon: warm start off (``warm_start.iterations=0``), the
curriculum fixed at one horizon, N GRPO iterations (2 with --quick), no checkpoint before the last.

* new defaults: the recipe as it is (``sampler.dtype`` and ``learner.precision`` ``auto``,
  ``learner.old_logprobs`` ``auto``, ``algorithm.kl_coef`` 0, ``algorithm.skip_uniform_groups`` true);
* previous defaults: the same with ``sampler.dtype=float32 learner.precision=float32
  learner.old_logprobs=recompute algorithm.kl_coef=0.001 algorithm.skip_uniform_groups=false``.

``iteration_new_vs_previous_defaults`` is the new run's mean ``time/iteration_s`` over the previous
run's (< 1: the new defaults are faster). With N > 2 iteration 0 is left out (it holds first-call
warm-up: allocator, autograd, the first weight sync); with N <= 2 (--quick) every iteration counts.
Per run the table splits an iteration into rollout, update (the learner call: the rest of the
iteration after rollout and weight sync) and weight sync, and shows the success rate, the groups the
algorithm skipped (all episodes with equal reward: no forward or backward) and the trajectories the
learner trained on, so the reader sees how many groups were informative. The two runs must have
played the same task in every group of every iteration (read back from ``trajectories/iter_*.jsonl``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
# Run as a script, this file's folder leads sys.path and its envs.py / learner.py would shadow the packages.
_HERE = str(Path(__file__).resolve().parent)
sys.path[:] = [str(REPO)] + [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

from agentgym_rl.actors.model_store import resolve_dtype
from agentgym_rl.learner.precision import resolve_precision

PREVIOUS = [
    "sampler.dtype=float32",
    "learner.precision=float32",
    "learner.old_logprobs=recompute",
    "algorithm.kl_coef=0.001",
    "algorithm.skip_uniform_groups=false",
]
GOAL = 1 / 3


def train(name: str, extra: list[str], *, model: str, horizon: int, iterations: int, root: Path) -> Path:
    """``agentgym-rl train configs/warm_start_grpo.yaml`` with this benchmark's settings and ``extra``; returns the
    run directory."""
    sets = [
        f"model.name={model}",
        "warm_start.iterations=0",
        "curriculum.schedule=fixed",
        f"curriculum.horizon={horizon}",
        f"trainer.iterations={iterations}",
        f"trainer.checkpoint_every={iterations + 1}",
        "logging.progress=false",
        "ray.num_cpus=2",
        "run.seed=0",
        f"run.dir={root}",
        f"run.name={name}",
        *extra,
    ]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    command = [sys.executable, "-m", "agentgym_rl.driver.cli", "train", "configs/warm_start_grpo.yaml"]
    command += [a for s in sets for a in ("--set", s)]
    done = subprocess.run(command, cwd=REPO, env=env, check=False, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the {name} run failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return root / name


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def trajectories(run: Path) -> list[list[dict]]:
    """Every iteration's trajectory records (failed episodes are not written)."""
    paths = sorted((run / "trajectories").glob("iter_*.jsonl"))
    return [[json.loads(line) for line in path.read_text().splitlines()] for path in paths]


def tasks(records: list[dict]) -> dict[int, int]:
    """The task id each group of one iteration played."""
    return {r["group"]: r["task_id"] for r in records}


def informative(records: list[dict]) -> int:
    """Groups of one iteration whose episodes' rewards differ (those GRPO learns from)."""
    rewards: dict[int, set[float]] = {}
    for r in records:
        rewards.setdefault(r["group"], set()).add(r["reward"])
    return sum(len(values) > 1 for values in rewards.values())


def split(record: dict) -> dict[str, float]:
    """One iteration's seconds: rollout, update (the rest after rollout and sync), sync, all."""
    rest = record["time/iteration_s"] - record["time/rollout_s"] - record["time/sync_s"]
    return {
        "iteration": record["time/iteration_s"],
        "rollout": record["time/rollout_s"],
        "update": rest,
        "sync": record["time/sync_s"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 iterations per run, both counted")
    parser.add_argument(
        "--model", default="smollm2-135m-instruct", help="built-in model name or model directory (default: SmolLM2)"
    )
    parser.add_argument("--horizon", type=int, default=6, help="the fixed horizon (turns per episode) of both runs")
    parser.add_argument("--iterations", type=int, default=None, help="GRPO iterations per run (default 2 quick, 5)")
    args = parser.parse_args()
    iterations = args.iterations or (2 if args.quick else 5)
    started = time.perf_counter()
    settings = {"model": args.model, "horizon": args.horizon, "iterations": iterations}
    with tempfile.TemporaryDirectory() as root:
        previous_run = train("previous", PREVIOUS, root=Path(root), **settings)
        new_run = train("new", [], root=Path(root), **settings)
        runs = {"previous defaults": metrics(previous_run), "new defaults": metrics(new_run)}
        played = {"previous defaults": trajectories(previous_run), "new defaults": trajectories(new_run)}
    # Iteration 0 starts from the same weights with the same seeds: with equal sampler dtypes, the same tokens.
    first = [sorted(r["token_ids"] for r in run[0]) for run in played.values()]
    for iteration, (old_records, new_records) in enumerate(zip(*played.values(), strict=True)):
        old, new = tasks(old_records), tasks(new_records)
        shared = old.keys() & new.keys()
        if any(old[g] != new[g] for g in shared) or not shared:
            raise RuntimeError(f"iteration {iteration}: the runs played other tasks: {old} against {new}")
    counted = slice(1, None) if iterations > 2 else slice(None)

    precision = resolve_precision("auto", torch.device("cpu"))
    print(
        f"model {args.model}, horizon {args.horizon}, {iterations} GRPO iterations per run; "
        f"here sampler.dtype auto = {resolve_dtype('auto')}, learner.precision auto = {precision}"
    )
    header = f"{'run':<18} {'iter':>4} {'seconds':>8} {'rollout':>8} {'update':>8} {'sync':>6} {'success':>8}"
    print(header + f" {'informative':>11} {'skipped':>7} {'trained':>7}")
    for name, records in runs.items():
        for r, episodes in zip(records, played[name], strict=True):
            s = split(r)
            # an iteration without an update call (every episode failed by an env) has no learner metrics
            trained = r.get("learner/trajectories", 0.0)
            groups = f"{informative(episodes)}/{r['rollout/groups']:.0f}"
            print(
                f"{name:<18} {r['iteration']:>4} {s['iteration']:>8.1f} {s['rollout']:>8.1f} {s['update']:>8.1f} "
                f"{s['sync']:>6.1f} {r['success_rate']:>8.2f} {groups:>11} {r['rollout/groups_skipped']:>7.0f} "
                f"{trained:>7.0f}"
            )
    print(
        "(informative: groups whose episodes' rewards differ / groups played; skipped: rollout/groups_skipped, "
        "groups left out of the update; trained: learner/trajectories; update: the rest of the iteration after "
        "rollout and sync)"
    )
    means = {
        name: {key: statistics.mean(split(r)[key] for r in records[counted]) for key in split(records[0])}
        for name, records in runs.items()
    }
    which = f"iterations 1 to {iterations - 1}" if iterations > 2 else "both iterations (iteration 0 included)"
    print(f"\nmean over {which}:")
    print(f"{'run':<18} {'seconds':>8} {'rollout':>8} {'update':>8} {'sync':>6}")
    for name, mean in means.items():
        print(
            f"{name:<18} {mean['iteration']:>8.1f} {mean['rollout']:>8.1f} {mean['update']:>8.1f} {mean['sync']:>6.1f}"
        )
    ratio = means["new defaults"]["iteration"] / means["previous defaults"]["iteration"]
    print(f"\n{'iteration seconds new / previous defaults (< 1: new faster)':<62} {ratio:>6.2f} (goal <= {GOAL:.2f})")
    new_records = runs["new defaults"]
    if all(r["rollout/groups_skipped"] == r["rollout/groups"] for r in new_records):
        why = (
            "every episode failed (an untrained base model writes no valid action)"
            if all(r["success_rate"] == 0 for r in new_records)
            else "in every group all episodes got the same reward"
        )
        print(
            f"in the new-defaults run {why}, so every group was skipped and no iteration trained or synced "
            "weights: the ratio shows the update saved, not a faster update"
        )
    print(
        f"(same task in every group of every iteration: yes; iteration 0 sampled the same tokens in both runs: "
        f"{'yes' if first[0] == first[1] else 'no'} (same weights and seeds; expected yes where both samplers run "
        f"float32); {time.perf_counter() - started:.0f} s in all)"
    )
    print(json.dumps({"ratios": {"iteration_new_vs_previous_defaults": round(ratio, 4)}}))


if __name__ == "__main__":
    main()

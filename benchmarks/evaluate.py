"""The cost of a held-out evaluation under different sampler settings, as ratios against the BabyAI stages'.

    python benchmarks/evaluate.py [--quick] [--episodes N] [--skip-vllm] [--rows ROW ...]

Every row is one ``agentgym-rl eval`` (``run_eval``, Ray started and stopped inside it, as the command does)
of the same N held-out BabyAI tasks (evenly spaced over the test split's 200, so every level is reached),
one episode each at temperature 1 from the same sampling seeds, at most 10 turns: the evaluation that
``docs/results/run_stage.sh babyai`` runs for every row, shortened. The policy is the committed SFT adapter
(SmolLM2-135M-Instruct + ``docs/results/babyai/sft/adapter``); ``--quick`` plays ``tiny-random`` on 8 tasks
instead (random text: every episode runs all 10 turns), to check the script in about a minute.

Rows, by the names ``--rows`` takes (one sampler unless said; the config's sampler settings otherwise):
* baseline: 16 env actors and batches of at most 16 (the stages' evaluation), ``sampler.dtype: auto``;
  run first and again last, and the ratios divide by the mean of the two (their spread is printed: it is
  the noise floor of every ratio on a shared machine);
* ``batch8`` and ``batch32``: batches of 8 (8 env actors) and of 32 (32 env actors);
* ``dtype``: the other dtype, float32 where ``auto`` resolves to bfloat16 here, else bfloat16;
* ``two_samplers``: two samplers of 8 env actors each, one thread each, instead of one of 16 on every core;
* ``vllm``: ``sampler.engine: vllm`` (vLLM's CPU build here; it merges the adapter at start), batches of 16.
  Left out, with a note, where vllm is not installed or ``--skip-vllm`` is given.

Per row: wall seconds of the whole command (sampler start and model load included), turns played, seconds
per turn, success rate. The sampled tokens can differ between rows (other kernels round differently, so
the same seed can draw other tokens), which changes how many turns the episodes last: ``s/turn`` is the
cost of the same work, ``wall`` the cost of this evaluation. The output ends with one JSON line of ratios
(row over baseline, < 1: cheaper): ``eval_<row>_wall`` and ``eval_<row>_per_turn``, and, under ``failed``,
each row that raised, with its error (the script goes on to the next row; only the baselines must run).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
REPO = Path(__file__).resolve().parents[1]
# Run as a script, this file's folder leads sys.path and its envs.py / learner.py would shadow the packages.
_HERE = str(Path(__file__).resolve().parent)
sys.path[:] = [str(REPO)] + [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

from agentgym_rl.actors.model_store import resolve_dtype
from agentgym_rl.driver.evaluate import EvalOptions, run_eval

SFT_ADAPTER = REPO / "docs" / "results" / "babyai" / "sft" / "adapter"
STAGE_CONFIG = REPO / "configs" / "babyai" / "grpo_stepwise.yaml"
OPTIONAL_ROWS = ("batch8", "batch32", "dtype", "two_samplers", "vllm")


def batch(size: int) -> list[str]:
    return [f"sampler.envs_per_sampler={size}", f"sampler.max_batch_size={size}"]


def evaluate(policy: dict, episodes: int, overrides: list[str], folder: Path) -> dict:
    """One evaluation with the stages' settings plus ``overrides``; its wall seconds, turns and successes."""
    options = EvalOptions(
        **policy,
        env="babyai",
        split="test",
        episodes=episodes,
        max_turns=10,
        config=str(STAGE_CONFIG),
        overrides=["sampler.start_timeout_s=900", "ray.address=local", *overrides],
        output=str(folder / f"{len(list(folder.iterdir()))}.json"),
    )
    started = time.perf_counter()
    report, _ = run_eval(options)
    seconds = time.perf_counter() - started
    results = report["results"]
    turns = sum(r["turns"] for r in results)
    return {
        "seconds": seconds,
        "turns": turns,
        "per_turn": seconds / turns,
        "success": sum(r["success"] for r in results) / len(results),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny-random on 8 tasks (about a minute a row)")
    parser.add_argument("--episodes", type=int, default=None, help="tasks per row (default 48; --quick: 8)")
    parser.add_argument("--skip-vllm", action="store_true", help="leave out the vLLM row")
    parser.add_argument(
        "--rows",
        nargs="+",
        choices=OPTIONAL_ROWS,
        default=None,
        help="only these rows besides the two baseline runs (default: all)",
    )
    args = parser.parse_args()
    episodes = args.episodes or (8 if args.quick else 48)
    policy = {"model": "tiny-random"} if args.quick else {"checkpoint": str(SFT_ADAPTER)}
    auto = resolve_dtype("auto")
    other = "float32" if auto == "bfloat16" else "bfloat16"
    rows: list[tuple[str, str, list[str]]] = [
        ("baseline", f"1 sampler, 16 envs, batch 16, {auto} (auto), all cores", batch(16)),
        ("batch8", "batch 8 (8 envs)", batch(8)),
        ("batch32", "batch 32 (32 envs)", batch(32)),
        ("dtype", f"sampler.dtype {other}", [*batch(16), f"sampler.dtype={other}"]),
        ("two_samplers", "2 samplers x 8 envs, 1 thread each", [*batch(8), "sampler.count=2", "sampler.num_threads=1"]),
    ]
    note = ""
    if args.skip_vllm:
        note = "vLLM row left out: --skip-vllm"
    elif importlib.util.find_spec("vllm") is None:
        note = "vLLM row left out: vllm is not installed (./install.sh --vllm)"
    else:
        rows.append(("vllm", "sampler.engine vllm, batch 16", [*batch(16), "sampler.engine=vllm"]))
    if args.rows is not None:
        rows = [row for row in rows if row[0] == "baseline" or row[0] in args.rows]
    rows.append(("baseline_again", "the baseline again", batch(16)))

    measured: dict[str, dict] = {}
    failed: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="eval-bench-") as folder:
        for key, label, overrides in rows:
            try:
                measured[key] = evaluate(policy, episodes, overrides, Path(folder))
            except Exception as exc:  # a row that cannot run is reported; the baselines must run
                if key.startswith("baseline"):
                    raise
                failed[key] = f"{type(exc).__name__}: {exc}".splitlines()[0]
                print(f"{label}: failed, {failed[key]}", flush=True)
                continue
            print(f"{label}: {measured[key]}", flush=True)

    base_wall = (measured["baseline"]["seconds"] + measured["baseline_again"]["seconds"]) / 2
    base_turn = (measured["baseline"]["per_turn"] + measured["baseline_again"]["per_turn"]) / 2
    print(
        f"\npolicy {policy}; {episodes} held-out BabyAI tasks, one episode each, at most 10 turns; "
        f"{os.cpu_count()} CPUs; dtype auto = {auto} here"
    )
    print(f"{'row':<56} {'wall s':>8} {'turns':>6} {'s/turn':>7} {'success':>8} {'wall/base':>10} {'turn/base':>10}")
    ratios = {}
    for key, label, _ in rows:
        if key in failed:
            print(f"{label:<56} failed: {failed[key]}")
            continue
        m = measured[key]
        wall, turn = m["seconds"] / base_wall, m["per_turn"] / base_turn
        print(
            f"{label:<56} {m['seconds']:>8.1f} {m['turns']:>6} {m['per_turn']:>7.2f} {m['success']:>8.3f} "
            f"{wall:>10.2f} {turn:>10.2f}"
        )
        if key not in ("baseline", "baseline_again"):
            ratios[f"eval_{key}_wall"] = round(wall, 3)
            ratios[f"eval_{key}_per_turn"] = round(turn, 3)
    spread = abs(measured["baseline"]["seconds"] - measured["baseline_again"]["seconds"]) / base_wall
    print(f"baseline spread (first against last run, over their mean): {spread:.2f}")
    if note:
        print(note)
    print(json.dumps({"ratios": ratios, "failed": failed}))


if __name__ == "__main__":  # vLLM's engine core is a spawned process: it re-imports this file
    main()

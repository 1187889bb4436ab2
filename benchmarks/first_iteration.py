"""Seconds from ``agentgym-rl train`` to the end of the quickstart's first iteration, as a new user waits for it.

    python benchmarks/first_iteration.py [--repo DIR] [--python DIR/.venv/bin/python] [--set key=value ...]

Starts ``python -m agentgym_rl.driver.cli train`` (the quickstart config, ``configs/quickstart.yaml``) in ``--repo``
(default: this checkout; give another checkout, e.g. a ``git worktree`` of an older commit with its own
environment, to compare the two on one machine the same day), watches the run's ``metrics.jsonl`` and stops the
run (SIGINT, as Ctrl-C) once iteration 0's record is written. Prints one JSON line: the seconds to the end of the
held-out measurement (its ``heldout/*`` keys arrive with iteration 0's record, so it is read from the log), to the
end of iteration 0, and iteration 0's own timings (``time/rollout_s``, ``time/update_s``, ...).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=REPO, help="checkout to run in (its configs/quickstart.yaml)")
    parser.add_argument("--python", default=sys.executable, help="the Python of that checkout's environment")
    parser.add_argument("--set", action="append", default=[], help="extra config overrides, as for train")
    parser.add_argument("--timeout", type=float, default=1800.0, help="give up after this many seconds")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        sets = [f"run.dir={root}", "run.name=first", "logging.progress=false", *args.set]
        command = [args.python, "-m", "agentgym_rl.driver.cli", "train", *[a for s in sets for a in ("--set", s)]]
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        log_path = Path(root) / "train.log"
        metrics = Path(root) / "first" / "metrics.jsonl"
        started = time.perf_counter()
        with log_path.open("w") as log:
            process = subprocess.Popen(command, cwd=args.repo, env=env, stdout=log, stderr=subprocess.STDOUT)
            heldout_s = None
            try:
                while time.perf_counter() - started < args.timeout:
                    if process.poll() is not None:
                        raise SystemExit(f"train ended early ({process.returncode}):\n{log_path.read_text()[-3000:]}")
                    if heldout_s is None and "held-out tasks played" in log_path.read_text():
                        heldout_s = time.perf_counter() - started
                    if metrics.exists() and metrics.read_text().strip():
                        break
                    time.sleep(0.5)
                else:
                    raise SystemExit(f"no iteration 0 within {args.timeout:.0f} s")
                first_s = time.perf_counter() - started
            finally:
                process.send_signal(signal.SIGINT)
                try:
                    process.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    process.kill()
        record = json.loads(metrics.read_text().splitlines()[0])
    print(
        json.dumps(
            {
                "repo": str(args.repo),
                "sets": args.set,
                "heldout_logged_s": None if heldout_s is None else round(heldout_s, 1),
                "iteration_0_end_s": round(first_s, 1),
                "iteration_0": {k: v for k, v in record.items() if k.startswith(("time/", "heldout/", "success"))},
            }
        )
    )


if __name__ == "__main__":
    main()

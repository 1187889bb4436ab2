"""Evaluate two policies on the same held-out tasks and compare them: `python docs/examples/eval_and_compare.py`.

Policy A is a model (`tiny-random` by default, or any built-in name, model directory or checkpoint with
`--checkpoint`); policy B is the env's oracle (`sampler.policy=oracle`), which always wins target-word.
Both play the same test tasks with the same sampling seed, so `agentgym-rl compare` can pair their
episodes task by task and give the exact McNemar p of the difference.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from agentgym_rl.driver.cli import main as agentgym_rl


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    policy = parser.add_mutually_exclusive_group()
    policy.add_argument("--model", default="tiny-random")
    policy.add_argument("--checkpoint")
    parser.add_argument("--episodes", type=int, default=24)
    parser.add_argument("--output-dir", default=None, help="where the reports go (default: a temporary folder)")
    args = parser.parse_args(argv)

    out = Path(args.output_dir or tempfile.mkdtemp(prefix="eval-and-compare-"))
    common = [
        "--env",
        "target-word",
        "--split",
        "test",
        "--episodes",
        str(args.episodes),
        "--max-turns",
        "2",
        "--seed",
        "0",
    ]
    common += ["--set", "sampler.sampling.max_new_tokens=8"]
    policy_a = ["--checkpoint", args.checkpoint] if args.checkpoint else ["--model", args.model]
    assert agentgym_rl(["eval", *policy_a, *common, "--output", str(out / "model.json")]) == 0
    oracle = ["--model", "tiny-random", "--set", "sampler.policy=oracle"]
    assert agentgym_rl(["eval", *oracle, *common, "--output", str(out / "oracle.json")]) == 0

    comparison_file = out / "comparison.json"
    assert (
        agentgym_rl(["compare", str(out / "model.json"), str(out / "oracle.json"), "--output", str(comparison_file)])
        == 0
    )
    comparison = json.loads(comparison_file.read_text())
    assert comparison["b"]["success_rate"] == 1.0  # the oracle solves every task
    if comparison["a"]["success_rate"] == 0.0:  # a model that solves none: every pair is discordant
        assert comparison["mcnemar_p"] < 0.01


if __name__ == "__main__":
    main()

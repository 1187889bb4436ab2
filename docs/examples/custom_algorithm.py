"""A custom algorithm, checked on a batch and then trained with: `python docs/examples/custom_algorithm.py`.

BestOfGroup reinforces only the best episode of each task's group (advantage 1 on its sampled tokens,
when it beats the group's worst by `margin`), reusing PolicyGradient's clipped surrogate, KL and
entropy terms. The script checks its advantages on a hand-made batch, then trains on `target-word`
with it by `module:Class` (`tiny-random` by default; `--model smollm2-135m-instruct` names the target in
about one turn of sixteen before any training, so groups differ and the advantages are non-zero).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
from pydantic import Field
from typing_extensions import override

from agentgym_rl.learner import PolicyGradient, PolicyGradientParams


class BestOfGroupParams(PolicyGradientParams):
    margin: float = Field(0.0, ge=0.0, description="How much the best must beat the worst of its group.")


class BestOfGroup(PolicyGradient):
    """Advantage 1 on the best episode of each group (if it beats the worst by `margin`), else 0."""

    name = "best_of_group"
    Config = BestOfGroupParams

    @override
    def estimate_advantages(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        rewards, groups = batch["rewards"], batch["groups"]
        best = torch.zeros_like(rewards)
        for group in groups.unique():
            members = (groups == group).nonzero().flatten()
            top = members[rewards[members].argmax()]
            if rewards[top] > rewards[members].min() + self.config.margin:
                best[top] = 1.0
        return best[:, None] * batch["loss_mask"]  # (B, T)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-random")
    parser.add_argument("--iterations", type=int, default=1)
    parser.add_argument("--run-dir", default=None, help="parent of the run directory (default: a temporary one)")
    args = parser.parse_args(argv)

    # The learner actors import the algorithm by "module:Class": this file's folder goes on PYTHONPATH before
    # Ray starts (its workers inherit it), and the module is imported under that name here too.
    here = str(Path(__file__).resolve().parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    sys.path.insert(0, here)
    from agentgym_rl.driver.cli import main as agentgym_rl
    from agentgym_rl.learner.algorithms import build_algorithm

    algorithm = build_algorithm("custom_algorithm:BestOfGroup", {"margin": 0.1})
    batch = {
        "rewards": torch.tensor([0.2, 0.9, 0.5, 0.5, 0.55]),
        "groups": torch.tensor([0, 0, 0, 1, 1]),
        "truncated": torch.zeros(5, dtype=torch.bool),
        "loss_mask": torch.ones(5, 3),
        "token_rewards": torch.zeros(5, 3),
    }
    best = algorithm.compute_advantages(batch)[:, 0].tolist()
    print(f"advantages of two groups (rewards 0.2 0.9 0.5 | 0.5 0.55, margin 0.1): {best}")
    assert best == [0.0, 1.0, 0.0, 0.0, 0.0]  # the second group's best beats its worst by less than the margin

    runs = args.run_dir or tempfile.mkdtemp(prefix="custom-algorithm-")
    settings = {
        "algorithm.name": "custom_algorithm:BestOfGroup",
        "model.name": args.model,
        "env.name": "target-word",
        "env.options": "{}",
        "warm_start.iterations": 0,
        "curriculum.schedule": "fixed",
        "curriculum.horizon": 2,
        "algorithm.group_size": 8,
        "trainer.tasks_per_iteration": 8,
        "sampler.envs_per_sampler": 16,
        "sampler.sampling.max_new_tokens": 8,
        "learner.lr": 2e-5,
        "learner.micro_batch_size": 8,
        "trainer.iterations": args.iterations,
        "logging.progress": False,
        "run.dir": runs,
        "run.name": "best-of-group",
    }
    overrides = [item for key, value in settings.items() for item in ("--set", f"{key}={value}")]
    status = agentgym_rl(["train", "warm_start_grpo.yaml", *overrides])
    assert status == 0, f"training exited with {status}"

    metrics = Path(runs) / "best-of-group" / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["iteration"] for r in records] == list(range(args.iterations))
    for r in records:
        print(
            f"iteration {r['iteration']}: mean reward {r['mean_reward']:.3f}, "
            f"advantage |mean| {r.get('learner/advantage_abs_mean', 0.0):.3f}, grad norm {r.get('learner/grad_norm', 0.0):.3f}"
        )
    print(f"metrics: {metrics}")


if __name__ == "__main__":
    main()

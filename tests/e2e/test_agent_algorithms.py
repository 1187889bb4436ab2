"""Each agent algorithm and policy-gradient option trains two iterations through the real CLI on tiny-random.

tiny-random never succeeds, so its rewards are all 0: the advantages are 0, groups are kept
(``skip_uniform_groups=false``) and the entropy bonus moves the weights. What this shows is the plumbing
(state keys from BabyAI to GiGPO's anchor groups, the options' losses, their metrics) giving finite
losses and non-zero gradients end to end; the estimators' values are the unit tests' business.
"""

import json
import math
from pathlib import Path

import pytest

from tests.e2e.test_train_cli import REPO, TINY, run_cli

# Each run covers one algorithm or option, some two, to keep the number of runs small.
RUNS = {
    "gigpo_overlong": ["algorithm.name=gigpo", "algorithm.overlong_penalty=0.1"],
    "gspo_tis": ["algorithm.name=gspo", "algorithm.rollout_correction=tis"],
    "cispo_mis": ["algorithm.name=cispo", "algorithm.rollout_correction=mis"],
    "grpo_turn_clip_higher": [
        "algorithm.name=grpo",
        "algorithm.credit=turn",
        "algorithm.turn_gamma=0.9",
        "algorithm.clip_low=0.2",
        "algorithm.clip_high=0.28",
    ],
    "rloo_turn": ["algorithm.name=rloo", "algorithm.credit=turn", "algorithm.turn_gamma=0.9"],
    "reinforce_pp_turn": ["algorithm.name=reinforce_pp", "algorithm.credit=turn", "algorithm.turn_gamma=0.9"],
}


@pytest.mark.slow
@pytest.mark.parametrize("run", sorted(RUNS))
def test_trains_two_iterations_with_finite_losses_and_nonzero_gradients(tmp_path: Path, run: str):
    settings = TINY[1::2]
    if run.startswith("reinforce_pp"):  # no groups to skip: the key is not one of its own
        settings = [s for s in settings if not s.startswith("algorithm.skip_uniform_groups")]
    overrides = [item for setting in [*settings, *RUNS[run]] for item in ("--set", setting)]
    result = run_cli(
        "train",
        str(REPO / "configs" / "warm_start_grpo.yaml"),
        *overrides,
        "--set",
        "trainer.iterations=2",
        "--set",
        f"run.dir={tmp_path / 'runs'}",
        "--set",
        f"run.name={run}",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "runs" / run / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in records] == [0, 1]
    for record in records:
        assert record["learner/optimizer_steps"] >= 1
        assert math.isfinite(record["learner/loss"]) and math.isfinite(record["learner/pg_loss"])
        assert 0 < record["learner/grad_norm"] < math.inf
    if run.startswith("gigpo"):
        # every episode of a group starts from the same BabyAI state: those turns form anchor groups
        assert all(r["learner/gigpo_anchored_token_frac"] > 0 for r in records)
    if "rollout_correction=" in " ".join(RUNS[run]):
        assert all(r["learner/rollout_is_weight_mean"] > 0 for r in records)

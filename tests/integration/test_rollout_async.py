"""Async trainer mode: rollout overlapped with training, bounded staleness, sampler log-probs."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentgym_rl.actors.trajectory import Trajectory
from agentgym_rl.configs import ConfigError, load_config
from agentgym_rl.driver.modes.asynchronous import drop_stale
from tests.factories import make_trajectory

REPO = Path(__file__).resolve().parents[2]
CLI = Path(sys.executable).parent / "agentgym-rl"
ASYNC_TINY = [
    "model.name=tiny-random",
    "model.adapter=null",  # the default config trains the SFT adapter of SmolLM2, not of tiny-random
    "trainer.mode=async",
    "trainer.max_staleness=1",
    "trainer.iterations=4",
    "trainer.tasks_per_iteration=2",
    "trainer.checkpoint_every=4",
    "algorithm.group_size=2",
    "algorithm.entropy_coef=0.01",
    # tiny-random never succeeds: every group is uniform, which GRPO would otherwise skip
    "algorithm.skip_uniform_groups=false",
    "learner.lr=1e-3",
    "learner.micro_batch_size=4",
    "learner.num_cpus=0.5",
    "sampler.num_cpus=0.5",
    "sampler.envs_per_sampler=4",
    "sampler.sampling.max_new_tokens=12",
    "curriculum.schedule=fixed",
    "curriculum.horizon=3",
    "logging.progress=false",
    "ray.num_cpus=2",
]


def test_async_mode_defaults_to_sampler_logprobs_and_rejects_recompute():
    assert load_config(None, ["trainer.mode=async"]).learner.old_logprobs == "sampler"
    assert load_config(None, []).learner.old_logprobs == "auto"
    with pytest.raises(ConfigError, match="learner.old_logprobs=sampler"):
        load_config(None, ["trainer.mode=async", "learner.old_logprobs=recompute"])
    with pytest.raises(ConfigError, match="temperature=1.0"):
        load_config(None, ["trainer.mode=async", "sampler.sampling.temperature=0.7"])
    with pytest.raises(ConfigError, match="max_staleness"):
        load_config(None, ["trainer.mode=async", "trainer.max_staleness=0"])


def _trajectory(version: int) -> Trajectory:
    return make_trajectory(
        [1, 2], [0, 1], [0.0], task_id=1, logprobs=[0.0, -1.0], actions=["x"], truncated=True, weights_version=version
    )


def test_drop_stale_keeps_exactly_the_trajectories_within_the_bound():
    trajectories = [_trajectory(v) for v in (5, 4, 3, 2)]
    refs, kept, dropped = drop_stale(["a", "b", "c", "d"], trajectories, learner_version=5, max_staleness=2)
    assert refs == ["a", "b", "c"] and [t.weights_version for t in kept] == [5, 4, 3] and dropped == 1


@pytest.mark.slow
def test_async_training_end_to_end_never_trains_on_stale_data(tmp_path: Path):
    command = [str(CLI)] if CLI.exists() else [sys.executable, "-m", "agentgym_rl.driver.cli"]
    sets = [arg for item in [*ASYNC_TINY, f"run.dir={tmp_path}", "run.name=async"] for arg in ("--set", item)]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    result = subprocess.run(
        [*command, "train", *sets], cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "async"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in records] == [0, 1, 2, 3]
    staleness = []
    for record in records:
        assert record["rollout/dropped_stale"] == 0 and record["rollout/failed"] == 0
        assert record["learner/trajectories"] == 4  # every played episode was trained on
        # the learner's ratio denominators are the sampler's log-probs
        assert record["learner/sampler_logprob_abs_diff"] == 0.0
        lines = (run_dir / "trajectories" / f"iter_{record['iteration']:06d}.jsonl").read_text().splitlines()
        versions = [json.loads(line)["weights_version"] for line in lines]
        assert len(versions) == 4
        staleness += [record["rollout/learner_version"] - v for v in versions]
    assert max(staleness) <= 1 and min(staleness) >= 0
    # Iteration k+1 was sampled while the learner trained on k: some data is exactly one version old.
    assert 1 in staleness
    assert records[-1]["weights_version"] == 4
    assert (run_dir / "checkpoints" / "iter_000004" / "policy").is_dir()

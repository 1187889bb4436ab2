"""The real `agentgym-rl train` against a local Ray instance too small for what the config asks."""

import json
import time
from pathlib import Path

import pytest

from tests.e2e.test_train_cli import run_cli

TINY = [
    "model.name=tiny-random",
    "model.adapter=null",  # the quickstart's adapter is SmolLM2's
    "warm_start.iterations=0",
    "trainer.iterations=1",
    # 2 tasks x the quickstart's group of 4: the test counts these 8 episodes (the quickstart's own 4 tasks since
    # ea5cf12 made the count 16), and no held-out episodes beside them
    "trainer.tasks_per_iteration=2",
    "trainer.heldout_tasks=0",
    "sampler.sampling.max_new_tokens=8",
    "curriculum.horizons=[2, 3]",
    "logging.progress=false",
    # Far beyond the test's limit: a run that waited for its actors to start would show it.
    "sampler.start_timeout_s=900",
]


def train(tmp_path: Path, *overrides: str):
    settings = [*TINY, *overrides, f"run.dir={tmp_path / 'runs'}", "run.name=fit"]
    return run_cli("train", *[arg for item in settings for arg in ("--set", item)], cwd=tmp_path)


def test_a_run_whose_minimum_cannot_fit_fails_at_once_naming_the_numbers(tmp_path: Path):
    # The quickstart's 1-CPU learner and 0.5-CPU sampler on a 1-CPU instance.
    started = time.monotonic()
    result = train(tmp_path, "ray.num_cpus=1")
    elapsed = time.monotonic() - started
    assert result.returncode == 2, result.stderr[-3000:]
    message = result.stderr.split("agentgym-rl: error: ")[-1]
    for part in (
        "1 learner(s) (learner.count, learner.num_cpus, learner.num_gpus, learner.resources) x {CPU: 1}",
        "1 sampler(s) of env babyai (sampler.min_count) x {CPU: 0.5}",
        "1 env actor(s) (sampler.min_envs_per_sampler) x {CPU: 0.05}",
        "In all {CPU: 1.55}",
        "node 0: {CPU: 1}",
    ):
        assert part in message, message
    # No actor was started: the run stops once Ray is up (seconds on an idle machine), not after a timeout.
    assert "sampler did not start" not in result.stderr
    assert elapsed < 300, f"took {elapsed:.0f} s"
    assert not (tmp_path / "runs" / "fit" / "metrics.jsonl").exists()


@pytest.mark.slow
def test_the_pool_starts_only_the_samplers_whose_env_actors_fit_and_says_so(tmp_path: Path):
    # The example: ray.num_cpus=2, a 1-CPU learner, two samplers of 0.5 CPU with 8 env actors of 0.05
    # each; the second sampler would leave its env actors no room.
    started = time.monotonic()
    result = train(tmp_path, "sampler.count=2")
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-3000:]
    events = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    smaller = [e for e in events if e["event"].startswith("the sampler pool is smaller than asked")]
    assert len(smaller) == 1 and (smaller[0]["samplers"], smaller[0]["asked"]) == (1, 2), smaller
    assert smaller[0]["env_actors_per_sampler"] == 8 and smaller[0]["sampler_needs"] == {"CPU": 0.5}
    records = [json.loads(line) for line in (tmp_path / "runs" / "fit" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["pool/samplers"], r["pool/env_actors"]) for r in records] == [(1, 8)]
    assert records[0]["rollout/episodes"] == 8  # every episode played on the one sampler
    assert elapsed < 900, f"took {elapsed:.0f} s: the run waited for actors that could not start"

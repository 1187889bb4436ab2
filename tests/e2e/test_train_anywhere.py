"""``agentgym-rl train`` with the default config from a directory outside the repository: the quickstart's
adapter path, relative to the repository root, is found from there (it was once taken from the working
directory, and the run stopped at "is not a LoRA adapter directory")."""

import json
from pathlib import Path

import pytest
import yaml

from tests.e2e.helpers import run_cli

REPO = Path(__file__).resolve().parents[2]

# The quickstart's model and adapter, on the least work a run does: one task played once for two turns of a few
# tokens, no held-out tasks.
CHEAPEST = [
    "trainer.iterations=1",
    "trainer.tasks_per_iteration=1",
    "algorithm.group_size=1",
    "sampler.envs_per_sampler=1",
    "sampler.sampling.max_new_tokens=4",
    "curriculum.horizons=[2]",
    "trainer.heldout_tasks=0",
]


@pytest.mark.slow  # 30 s alone, about a minute beside CI's other workers: the CI tier has no minute to spare
def test_the_default_config_trains_from_outside_the_repository(tmp_path: Path):
    overrides = [*CHEAPEST, f"run.dir={tmp_path / 'runs'}", "run.name=anywhere"]
    done = run_cli("train", *(arg for item in overrides for arg in ("--set", item)), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = tmp_path / "runs" / "anywhere"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in records] == [0]
    # The run directory's config names the adapter absolutely, so --resume finds it from anywhere too.
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["model"]["name"] == "smollm2-135m-instruct"
    assert saved["model"]["adapter"] == str(REPO / "docs/results/babyai/sft/adapter")

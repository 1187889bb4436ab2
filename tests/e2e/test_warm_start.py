"""`train` with an SFT warm start: oracle demonstrations first, then RL from the warm-start policy."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from agentgym_rl.actors.model_store import model_dir
from tests.e2e.helpers import cli_env

REPO = Path(__file__).resolve().parents[2]
CLI = Path(sys.executable).parent / "agentgym-rl"
SETTINGS = [
    "model.name=tiny-random",
    "sampler.sampling.max_new_tokens=8",
    "curriculum.horizons=[2, 3]",
    "curriculum.advance_every=1",
    "warm_start.iterations=1",
    "warm_start.tasks_per_iteration=4",
    # a large warm-start step and a tiny RL step: the RL policy must stay near where the warm start left it
    "warm_start.lr=1e-2",
    "learner.lr=1e-7",
    "trainer.checkpoint_every=1",
    "logging.progress=false",
]


def train(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    command = [str(CLI)] if CLI.exists() else [sys.executable, "-m", "agentgym_rl.driver.cli"]
    env = cli_env()
    return subprocess.run(
        [*command, "train", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False
    )


def parameters(path: Path) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_rl_starts_from_the_warm_start_policy_and_resume_does_not_repeat_it(tmp_path: Path):
    runs = tmp_path / "runs"
    sets = [item for s in [*SETTINGS, f"run.dir={runs}", "run.name=ws"] for item in ("--set", s)]
    first = train(str(REPO / "configs" / "warm_start_grpo.yaml"), *sets, "--set", "trainer.iterations=1", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]

    run = runs / "ws"
    warm = lines(run / "warm_start" / "metrics.jsonl")
    assert [r["iteration"] for r in warm] == [0]
    assert warm[0]["success_rate"] == 1.0  # the BabyAI bot's demonstrations all succeed
    assert warm[0]["horizon"] == 3  # the curriculum's largest horizon
    demos = lines(run / "warm_start" / "trajectories" / "iter_000000.jsonl")
    assert len(demos) == 4 and all(d["success"] for d in demos)
    assert [r["iteration"] for r in lines(run / "metrics.jsonl")] == [0]

    base = parameters(model_dir("tiny-random"))
    warm_policy = parameters(run / "warm_start" / "checkpoints" / "iter_000001" / "policy")
    rl_policy = parameters(run / "checkpoints" / "iter_000001" / "policy")
    assert (warm_policy - base).norm() > 10 * (rl_policy - warm_policy).norm()

    again = train("--resume", str(run), "--set", "trainer.iterations=2", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "warm start already done" in again.stdout + again.stderr
    assert len(lines(run / "warm_start" / "metrics.jsonl")) == 1
    assert [r["iteration"] for r in lines(run / "metrics.jsonl")] == [0, 1]

"""The real `agentgym-rl` command, end to end, on tiny-random."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from transformers import AutoModelForCausalLM

from agentgym_rl.envs import names
from tests.e2e.helpers import cli_env, same_episodes

REPO = Path(__file__).resolve().parents[2]
CLI = Path(sys.executable).parent / "agentgym-rl"
TINY = [
    "--set",
    "model.name=tiny-random",
    # float32 throughout: where `auto` picks bfloat16 (a CPU the probe finds fast at it), two fresh runs' log-probs
    # differ by about 1e-4 (bfloat16 CPU kernels are not batch-invariant), and these tests compare runs exactly
    "--set",
    "sampler.dtype=float32",
    "--set",
    "learner.precision=float32",
    # an entropy bonus and a large step make the weights move although tiny-random never succeeds
    "--set",
    "algorithm.entropy_coef=0.01",
    # tiny-random never succeeds: every group is uniform, which GRPO would otherwise skip
    "--set",
    "algorithm.skip_uniform_groups=false",
    "--set",
    "learner.lr=1e-3",
    "--set",
    "sampler.sampling.max_new_tokens=16",
    "--set",
    "curriculum.horizons=[2, 3]",
    "--set",
    "curriculum.advance_every=2",
    "--set",
    "trainer.checkpoint_every=2",
    "--set",
    "warm_start.iterations=0",
]


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    command = [str(CLI)] if CLI.exists() else [sys.executable, "-m", "agentgym_rl.driver.cli"]
    env = cli_env()
    return subprocess.run([*command, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False)


# In the slow tier's rotation: the CI tier keeps a resume compared with an uninterrupted run in the SIGKILL test
# (tests/e2e/test_crash_resume.py), and resumes after lost actors and a killed driver.
@pytest.mark.slow
def test_train_two_iterations_then_resume_matches_an_uninterrupted_run(tmp_path: Path):
    run_dir = tmp_path / "runs" / "tiny"
    common = [*TINY, "--set", f"run.dir={tmp_path / 'runs'}", "--set", "run.name=tiny"]
    first = run_cli(
        "train", str(REPO / "configs" / "warm_start_grpo.yaml"), *common, "--set", "trainer.iterations=2", cwd=tmp_path
    )
    assert first.returncode == 0, first.stderr[-3000:]
    assert "finished iteration 1" in first.stdout

    assert (run_dir / "config.yaml").is_file()
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in records] == [0, 1]
    assert [r["weights_version"] for r in records] == [1, 2]
    for record in records:
        for key in ("horizon", "success_rate", "mean_reward", "learner/loss", "time/iteration_s"):
            assert key in record
    lines = (run_dir / "trajectories" / "iter_000001.jsonl").read_text().splitlines()
    assert len(lines) == 2 * 4  # tasks_per_iteration x group_size of the warm_start_grpo preset
    assert json.loads(lines[0])["weights_version"] == 1
    checkpoint = run_dir / "checkpoints" / "iter_000002"
    model = AutoModelForCausalLM.from_pretrained(checkpoint / "policy")
    assert model.config.num_hidden_layers == 2

    again = run_cli("train", str(REPO / "configs" / "warm_start_grpo.yaml"), *common, cwd=tmp_path)
    assert again.returncode == 2 and "--resume" in again.stderr

    resumed = run_cli("train", "--resume", str(run_dir), "--set", "trainer.iterations=4", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    straight = run_cli(
        "train",
        str(REPO / "configs" / "warm_start_grpo.yaml"),
        *TINY,
        "--set",
        f"run.dir={tmp_path / 'runs'}",
        "--set",
        "run.name=straight",
        "--set",
        "trainer.iterations=4",
        cwd=tmp_path,
    )
    assert straight.returncode == 0, straight.stderr[-3000:]

    # Stopping after 2 and resuming to 4 gives the run an uninterrupted 4 iterations gives.
    resumed_records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    straight_dir = tmp_path / "runs" / "straight"
    straight_records = [json.loads(line) for line in (straight_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in resumed_records] == [0, 1, 2, 3]
    assert resumed_records[2]["horizon"] == 3  # stepwise: iterations 2-3 are the second stage
    for mine, theirs in zip(resumed_records, straight_records, strict=True):
        for key, value in theirs.items():
            if not key.startswith("time/"):
                assert mine[key] == pytest.approx(value, rel=1e-4, abs=1e-6), (mine["iteration"], key)
    for name in ("iter_000004",):
        a = AutoModelForCausalLM.from_pretrained(run_dir / "checkpoints" / name / "policy").state_dict()
        b = AutoModelForCausalLM.from_pretrained(straight_dir / "checkpoints" / name / "policy").state_dict()
        for key in a:
            assert torch.allclose(a[key], b[key], atol=1e-5), key
    same_episodes(run_dir / "trajectories" / "iter_000003.jsonl", straight_dir / "trajectories" / "iter_000003.jsonl")


def test_bad_config_key_fails_with_its_name(tmp_path: Path):
    result = run_cli("train", "--set", "trainer.iteratons=2", cwd=tmp_path)
    assert result.returncode == 2
    assert "trainer.iteratons" in result.stderr and "unknown key" in result.stderr
    assert not (tmp_path / "runs").exists()


def test_envs_lists_every_env_cleanly(tmp_path: Path):
    result = run_cli("envs", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines() if line.startswith("babyai")]
    assert [row[1] for row in rows] == ["train", "test"]
    assert all(int(row[2]) > 0 for row in rows)
    listed = {line.split()[0] for line in result.stdout.splitlines()[1:] if not line.startswith(" ")}
    # Other test modules register "test-" envs in this process; the CLI's own process has only the package's.
    assert listed == {name for name in names() if not name.startswith("test-")}
    for remote in ("agentgym-remote", "webarena-remote"):
        assert f"{remote:<16} {'-':<6} {'-':>8}  (needs options: env.options.base_url)" in result.stdout
    assert "validation error" not in result.stdout and "``" not in result.stdout


# Tiny settings that leave the algorithm section alone (each algorithm knows other keys).
SWITCH = [
    "model.name=tiny-random",
    "model.adapter=null",  # the quickstart's adapter is SmolLM2's
    "warm_start.iterations=0",
    "trainer.iterations=1",
    "sampler.sampling.max_new_tokens=8",
    "curriculum.horizons=[2, 3]",
    "logging.progress=false",
]


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["sft", "dpo"])
def test_switching_algorithm_on_the_command_line_trains(tmp_path: Path, algorithm: str):
    overrides = [*SWITCH, f"algorithm.name={algorithm}", f"run.dir={tmp_path / 'runs'}", "run.name=switched"]
    result = run_cli("train", *[arg for item in overrides for arg in ("--set", item)], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    warnings = [line for line in result.stderr.splitlines() if "the new algorithm does not know" in line]
    assert len(warnings) == 1, result.stderr[-3000:]
    for key in ("algorithm.clip_eps", "algorithm.kl_coef", "algorithm.entropy_coef"):
        assert key in warnings[0]
    run_dir = tmp_path / "runs" / "switched"
    assert [json.loads(line)["iteration"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()] == [0]
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())["algorithm"]
    assert saved["name"] == algorithm and "clip_eps" not in saved


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["algorithm.name=sft", "algorithm.clip_epz=0.1"], "algorithm.clip_epz: unknown key for algorithm 'sft'"),
        (["algorithm.name=dpo", "algorithm.kl_coef=0.1"], "algorithm.kl_coef: unknown key for algorithm 'dpo'"),
    ],
)
def test_a_key_set_on_the_command_line_is_still_refused_after_a_switch(tmp_path: Path, overrides, named):
    result = run_cli("train", *[arg for item in overrides for arg in ("--set", item)], cwd=tmp_path)
    assert result.returncode == 2 and named in result.stderr, result.stderr[-2000:]
    assert not (tmp_path / "runs").exists()

"""The real `agentgym-rl eval` command on tiny-random: local Ray, real samplers, real BabyAI."""

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

from agentgym_rl.actors.model_store import model_dir
from agentgym_rl.actors.rundir import RunDir
from agentgym_rl.configs import Config
from agentgym_rl.driver.cli import main
from agentgym_rl.driver.evaluate import episode_seeds
from agentgym_rl.envs.babyai import LEVELS

CLI = Path(sys.executable).parent / "agentgym-rl"
# short replies keep the run small; tiny-random never succeeds, the numbers are checked for shape
FAST = ["--set", "sampler.sampling.max_new_tokens=8", "--set", "sampler.envs_per_sampler=2"]


def cli_command(*args: str) -> list[str]:
    return [*([str(CLI)] if CLI.exists() else [sys.executable, "-m", "agentgym_rl.driver.cli"]), *args]


def cli_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        cli_command(*args), cwd=cwd, env=cli_env(), capture_output=True, text=True, timeout=900, check=False
    )


@pytest.mark.slow
def test_eval_model_writes_a_report_with_every_task_sampled_k_times(tmp_path: Path):
    output = tmp_path / "out" / "report.json"
    done = run_cli(
        "eval", "--model", "tiny-random", "--env", "babyai", "--episodes", "4", "--samples", "2",
        "--max-turns", "2", "--output", str(output), *FAST, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(output.read_text())
    assert (report["env"], report["split"], report["samples"], report["max_turns"]) == ("babyai", "test", 2, 2)
    assert report["temperature"] == 1.0  # the paper's evaluation temperature
    results = report["results"]
    assert len(results) == 8
    tasks = sorted({r["task_id"] for r in results})
    assert len(tasks) == 4
    assert all(sorted(r["sample"] for r in results if r["task_id"] == t) == [0, 1] for t in tasks)
    assert all(r["category"] == LEVELS[r["task_id"] % 40] for r in results)
    assert all(1 <= r["turns"] <= 2 for r in results)
    overall = report["overall"]
    assert overall["episodes"] == 8 and overall["tasks"] == 4
    assert overall["success_rate"] == sum(r["success"] for r in results) / 8
    assert set(report["categories"]) == {LEVELS[t % 40] for t in tasks}
    assert "pass@2" in overall and "avg@2" in overall
    assert "overall" in done.stdout and f"report: {output}" in done.stdout
    progress = [line for line in (done.stdout + done.stderr).splitlines() if "eval progress" in line]
    assert progress and "4/4" in progress[-1]  # the last task reported, with the running success rate


@pytest.mark.slow
def test_eval_checkpoint_inside_a_run_writes_into_the_runs_eval_folder(tmp_path: Path):
    run = RunDir(tmp_path / "runs" / "tiny")
    run.create(Config.model_validate({"env": {"name": "babyai", "options": {"levels": ["GoToRedBall"]}}}))
    checkpoint = run.checkpoint_dir(2)
    shutil.copytree(model_dir("tiny-random"), checkpoint / "policy")
    (checkpoint / "trainer.json").write_text("{}")

    done = run_cli(
        "eval", "--checkpoint", str(checkpoint), "--env", "babyai", "--episodes", "1", "--max-turns", "1",
        *FAST, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((run.path / "eval" / "babyai-test-iter_000002.json").read_text())
    # the run's env options apply: only GoToRedBall tasks exist there
    assert [r["category"] for r in report["results"]] == ["GoToRedBall"]
    assert report["policy"] == str(checkpoint / "policy")


@pytest.mark.slow
def test_eval_of_a_mixed_runs_checkpoint_reports_each_env_with_its_entrys_options(tmp_path: Path):
    run = RunDir(tmp_path / "runs" / "mix")
    babyai = {"name": "babyai", "options": {"levels": ["GoToRedBall"], "test_seeds": 1}}
    textcraft = {"name": "textcraft", "options": {"test_size": 3}}
    mix = {"warm_start": {"iterations": 0}, "trainer": {"tasks_per_iteration": 2}, "envs": [babyai, textcraft]}
    run.create(Config.model_validate(mix))
    checkpoint = run.checkpoint_dir(1)
    shutil.copytree(model_dir("tiny-random"), checkpoint / "policy")
    (checkpoint / "trainer.json").write_text("{}")

    done = run_cli(
        "eval", "--checkpoint", str(run.path), "--env", "babyai", "--env", "textcraft", "--max-turns", "1",
        *FAST, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    # each env plays the whole test split its entry defines: 1 BabyAI level x 1 seed, 3 TextCraft goals
    reports = {
        env: json.loads((run.path / "eval" / f"{env}-test-iter_000001.json").read_text())
        for env in ("babyai", "textcraft")
    }
    assert [r["category"] for r in reports["babyai"]["results"]] == ["GoToRedBall"]
    assert len(reports["textcraft"]["results"]) == 3 and reports["textcraft"]["overall"]["tasks"] == 3
    assert done.stdout.count("report: ") == 2 and done.stdout.index("babyai (test") < done.stdout.index("textcraft")

    done = run_cli(
        "eval", "--model", "tiny-random", "--env", "babyai", "--env", "textcraft", "--output", "x.json", cwd=tmp_path
    )
    assert done.returncode == 2 and "--output names one report" in done.stderr


def test_eval_rejects_an_env_without_a_turn_limit_and_a_missing_checkpoint(tmp_path: Path, capsys):
    # In-process: both are refused before Ray starts (the one-line error path itself is tested in test_cli_errors).
    assert main(["eval", "--checkpoint", str(tmp_path / "nowhere"), "--env", "babyai"]) == 2
    assert "neither a policy/ model or adapter nor a model or adapter directory" in capsys.readouterr().err
    assert main(["eval", "--model", "tiny-random", "--env", "agentgym-remote"]) == 2
    assert "has no published turn limit; pass --max-turns N" in capsys.readouterr().err


def sampler_processes(parent: psutil.Process) -> list[psutil.Process]:
    """The live Ray worker processes of ``parent``'s sampler actors (Ray titles them ``ray::SamplerActor...``)."""
    found = []
    for proc in parent.children(recursive=True):
        try:
            if "SamplerActor" in " ".join(proc.cmdline()):
                found.append(proc)
        except psutil.Error:
            continue
    return found


@pytest.mark.slow
def test_eval_replays_a_killed_samplers_tasks_on_the_survivor_with_the_same_seeds(tmp_path: Path):
    # One env actor per sampler plays one episode at a time, so the killed sampler still has most of its tasks queued.
    common = (
        "eval", "--model", "tiny-random", "--env", "babyai", "--episodes", "24", "--max-turns", "3",
        "--set", "sampler.sampling.max_new_tokens=16", "--set", "sampler.envs_per_sampler=1",
        "--set", "sampler.min_count=1",
    )  # fmt: skip
    killed = tmp_path / "killed.json"
    proc = subprocess.Popen(
        cli_command(*common, "--set", "sampler.count=2", "--output", str(killed)),
        cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: list[str] = []
    first_progress = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            lines.append(line)
            if "eval progress" in line:
                first_progress.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert first_progress.wait(600), "".join(lines)[-3000:]
        samplers = sampler_processes(psutil.Process(proc.pid))
        assert len(samplers) == 2, "".join(lines)[-3000:]
        samplers[0].kill()
        assert proc.wait(600) == 0, "".join(lines)[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(10)
    report = json.loads(killed.read_text())
    assert report["samplers_lost"] == 1 and report["tasks_replayed"] >= 1
    assert "task group moved to another sampler" in "".join(lines)

    # Every task played once, from the seeds an undisturbed one-sampler eval uses, with the same outcome.
    calm = tmp_path / "calm.json"
    done = run_cli(*common, "--set", "sampler.count=1", "--output", str(calm), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    baseline = json.loads(calm.read_text())
    assert (baseline["samplers_lost"], baseline["tasks_replayed"]) == (0, 0)
    assert len(report["results"]) == 24 and len({r["task_id"] for r in report["results"]}) == 24
    assert all(r["seed"] == episode_seeds(0, r["task_id"], 1)[0] for r in report["results"])
    assert report["results"] == baseline["results"]


@pytest.mark.slow  # two eval start-ups and an export: about a minute on two cores
def test_eval_of_a_lora_checkpoint_plays_as_its_exported_merged_model(tmp_path: Path):
    from tests.unit.driver.test_evaluate import lora_checkpoint

    checkpoint = lora_checkpoint(tmp_path / "runs" / "lora")
    merged = tmp_path / "merged"
    assert run_cli("export", "--checkpoint", str(checkpoint), "--output", str(merged), cwd=tmp_path).returncode == 0
    reports = {}
    for name, source in (("adapter", checkpoint), ("merged", merged)):
        output = tmp_path / f"{name}.json"
        done = run_cli(
            "eval", "--checkpoint", str(source), "--env", "babyai", "--episodes", "3", "--max-turns", "2",
            "--output", str(output), "--set", "sampler.dtype=float32", *FAST, cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        reports[name] = json.loads(output.read_text())
    assert reports["adapter"]["policy"] == str(checkpoint / "policy")
    # same tasks, seeds and weights (float32 merges of the same adapter): the same per-episode results (token-level
    # equality of adapter and merged sampling is tests/unit/learner/test_lora_publishing.py's)
    assert reports["adapter"]["results"] == reports["merged"]["results"]
    assert [r["seed"] for r in reports["adapter"]["results"]] == [r["seed"] for r in reports["merged"]["results"]]

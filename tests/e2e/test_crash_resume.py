"""Stopping a training run and resuming it: SIGKILL while a checkpoint is written, SIGINT or SIGTERM to a
background job, --time-limit, and a run that loses a sampler and an env actor before its driver is killed; each
time --resume ends with every iteration exactly once."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.e2e.helpers import cli_env, same_episodes

REPO = Path(__file__).resolve().parents[2]
CLI = Path(sys.executable).parent / "agentgym-rl"
SETTINGS = [
    "model.name=tiny-random",
    # float32 throughout: where `auto` picks bfloat16 (a CPU the probe finds fast at it), two fresh runs' log-probs
    # differ by about 1e-4 (bfloat16 CPU kernels are not batch-invariant), and these tests compare runs exactly
    "sampler.dtype=float32",
    "learner.precision=float32",
    "algorithm.entropy_coef=0.01",
    # tiny-random never succeeds: every group is uniform, which GRPO would otherwise skip
    "algorithm.skip_uniform_groups=false",
    "learner.lr=1e-3",
    "sampler.sampling.max_new_tokens=12",
    "curriculum.horizons=[1, 2]",
    "curriculum.advance_every=2",
    "trainer.iterations=4",
    "trainer.checkpoint_every=1",
    "logging.progress=false",
    "warm_start.iterations=0",
]


def command(*args: str) -> list[str]:
    base = [str(CLI)] if CLI.exists() else [sys.executable, "-m", "agentgym_rl.driver.cli"]
    return [*base, *args]


def run_cli(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(command(*args), cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False)


def overrides(runs: Path, name: str) -> list[str]:
    return [item for setting in [*SETTINGS, f"run.dir={runs}", f"run.name={name}"] for item in ("--set", setting)]


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the driver and every process it started (its local Ray instance included)."""
    family = psutil.Process(proc.pid).children(recursive=True)
    os.kill(proc.pid, signal.SIGKILL)
    for child in family:
        with contextlib.suppress(psutil.NoSuchProcess):  # it may have died with its parent
            child.kill()
    proc.wait(timeout=30)


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def rollouts_started(log: Path) -> set[int]:
    """The iterations whose rollout the driver has started, read from its log lines."""
    started = set()
    for line in log.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):  # Ray's own lines, and a line being written
            event = json.loads(line) if line.startswith("{") else {}
            if event.get("event") == "rollout started":
                started.add(event["iteration"])
    return started


def kill_actor_process(proc: subprocess.Popen, actor_class: str) -> int:
    """SIGKILL the process of one ``actor_class`` actor among the driver's descendants; returns its PID."""
    for child in psutil.Process(proc.pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):  # a process that ended meanwhile
            if child.cmdline() and child.cmdline()[0].startswith(f"ray::{actor_class}"):
                child.kill()
                return child.pid
    raise AssertionError(f"no {actor_class} process under the driver")


@pytest.mark.slow
def test_sigkill_during_a_checkpoint_write_then_resume(tmp_path: Path):
    runs = tmp_path / "runs"
    run_dir = runs / "crash"
    env = cli_env()
    proc = subprocess.Popen(
        command("train", str(REPO / "configs" / "warm_start_grpo.yaml"), *overrides(runs, "crash")),
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 400
    try:
        # Wait for the second checkpoint's staging folder: one complete checkpoint exists by then.
        while time.monotonic() < deadline and proc.poll() is None:
            if list((run_dir / "checkpoints").glob(".iter_000002.partial")):
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the run ended before the checkpoint write could be interrupted"
        kill_tree(proc)
    finally:
        if proc.poll() is None:
            kill_tree(proc)

    complete = sorted(p.name for p in (run_dir / "checkpoints").glob("iter_*") if (p / "trainer.json").exists())
    assert complete == ["iter_000001"]

    resumed = run_cli("train", "--resume", str(run_dir), cwd=tmp_path, env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    straight = run_cli(
        "train", str(REPO / "configs" / "warm_start_grpo.yaml"), *overrides(runs, "straight"), cwd=tmp_path, env=env
    )
    assert straight.returncode == 0, straight.stderr[-3000:]

    got, expected = metrics(run_dir), metrics(runs / "straight")
    assert [r["iteration"] for r in got] == [0, 1, 2, 3]  # every iteration exactly once
    for mine, theirs in zip(got, expected, strict=True):
        for key in ("horizon", "weights_version", "success_rate", "learner/loss", "learner/grad_norm"):
            assert mine[key] == pytest.approx(theirs[key], rel=1e-4, abs=1e-6), (mine["iteration"], key)
    same_episodes(
        run_dir / "trajectories" / "iter_000003.jsonl", runs / "straight" / "trajectories" / "iter_000003.jsonl"
    )


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_background_run_stops_on_a_signal_and_resumes(tmp_path: Path, signum: int):
    runs = tmp_path / "runs"
    run_dir = runs / "stopped"
    env = cli_env()
    log = tmp_path / "stderr.log"
    with log.open("w") as stderr:
        proc = subprocess.Popen(
            command("train", str(REPO / "configs" / "warm_start_grpo.yaml"), *overrides(runs, "stopped")),
            cwd=tmp_path,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            # A background job of a non-interactive shell (or under nohup) starts with SIGINT ignored.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),  # noqa: PLW1509
        )
        try:
            deadline = time.monotonic() + 400
            while time.monotonic() < deadline and proc.poll() is None:
                if (run_dir / "checkpoints" / "iter_000001" / "trainer.json").exists():
                    break
                time.sleep(0.1)
            assert proc.poll() is None, log.read_text()[-3000:]
            proc.send_signal(signum)
            proc.wait(timeout=60)  # a stop takes seconds; the bound only keeps a hang from stalling the suite
        finally:
            if proc.poll() is None:
                kill_tree(proc)
    said = log.read_text()
    assert proc.returncode == 128 + signum, said[-3000:]
    assert f"Continue with: agentgym-rl train --resume {run_dir}" in said
    assert f"{signum.name} received" not in said  # Ray's native stack dump

    resumed = run_cli("train", "--resume", str(run_dir), cwd=tmp_path, env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [r["iteration"] for r in metrics(run_dir)] == [0, 1, 2, 3]  # every iteration exactly once


@pytest.mark.slow
def test_a_time_limit_stops_after_a_checkpointed_iteration_and_resume_finishes(tmp_path: Path):
    runs = tmp_path / "runs"
    run_dir = runs / "limited"
    env = cli_env()
    # Checkpoints every 3 iterations: the stop after iteration 0 must write one of its own.
    settings = [*overrides(runs, "limited"), "--set", "trainer.checkpoint_every=3"]
    config = str(REPO / "configs" / "warm_start_grpo.yaml")
    stopped = run_cli("train", config, *settings, "--time-limit", "1", cwd=tmp_path, env=env)
    assert stopped.returncode == 3, stopped.stderr[-3000:]
    assert "after iteration 0 of 4, checkpointed (sync: success_rate=" in stopped.stderr
    assert f"Continue with: agentgym-rl train --resume {run_dir}" in stopped.stderr
    assert [r["iteration"] for r in metrics(run_dir)] == [0]
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("iter_*")) == ["iter_000001"]

    resumed = run_cli("train", "--resume", str(run_dir), "--time-limit", "3600", cwd=tmp_path, env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (
        "finished iteration 3 of 4 (sync): success_rate=" in resumed.stdout and "stopped before" not in resumed.stderr
    )
    assert [r["iteration"] for r in metrics(run_dir)] == [0, 1, 2, 3]  # every iteration exactly once


def start_train(tmp_path: Path, name: str, settings: list[str]) -> tuple[subprocess.Popen, Path]:
    """``agentgym-rl train`` on warm_start_grpo.yaml in the background, its output to a log file; the process and
    the log."""
    runs = tmp_path / "runs"
    args = [*overrides(runs, name), *[item for setting in settings for item in ("--set", setting)]]
    log = tmp_path / "driver.log"
    with log.open("w") as output:
        proc = subprocess.Popen(
            command("train", str(REPO / "configs" / "warm_start_grpo.yaml"), *args),
            cwd=tmp_path,
            env=cli_env(),
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    return proc, log


def await_rollout(proc: subprocess.Popen, log: Path, iteration: int) -> None:
    """Wait until the run has started ``iteration``'s rollout (fail if it ends first)."""
    deadline = time.monotonic() + 400
    while iteration not in rollouts_started(log) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, log.read_text()[-3000:]
    assert iteration in rollouts_started(log), f"iteration {iteration}'s rollout did not start within 400 s"


def each_iteration_once_with_one_sampler_replaced(records: list[dict], iterations: int, samplers: int) -> None:
    assert [r["iteration"] for r in records] == list(range(iterations))  # every iteration exactly once
    assert sum(r["pool/samplers_lost"] for r in records) == 1
    assert sum(r["pool/samplers_added"] for r in records) == 1  # the replacement, started where there was room
    assert [r["pool/samplers"] for r in records][1:] == [samplers] * (iterations - 1)
    for record in records:  # every iteration played all of its episodes: 2 tasks x groups of 4
        assert record["rollout/episodes"] + record["rollout/failed"] == 8


# In the slow tier's rotation: the CI tier's elastic test (tests/integration/test_cluster.py) loses a sampler with its
# env actors mid-iteration and resumes exactly; the SIGKILL test above kills the driver.
@pytest.mark.slow
def test_a_run_survives_a_lost_sampler_and_env_actor_then_a_killed_driver_resumes(tmp_path: Path):
    run_dir = tmp_path / "runs" / "faults"
    # The default (disaggregated) placement, two samplers of two env actors, and CPUs to spare: the lost
    # sampler's replacement has room to start at the next iteration.
    faults = ["trainer.iterations=3", "sampler.count=2", "sampler.envs_per_sampler=2", "ray.num_cpus=4"]
    proc, log = start_train(tmp_path, "faults", faults)
    try:
        # Each by PID while a rollout runs: a sampler in iteration 0, an env actor in iteration 1, the driver
        # (and its Ray) in iteration 2, after iteration 1's checkpoint.
        for iteration, victim in ((0, "SamplerActor"), (1, "EnvHost")):
            await_rollout(proc, log, iteration)
            kill_actor_process(proc, victim)
        await_rollout(proc, log, 2)
        kill_tree(proc)
    finally:
        if proc.poll() is None:
            kill_tree(proc)
    assert [r["iteration"] for r in metrics(run_dir)] == [0, 1]

    resumed = run_cli("train", "--resume", str(run_dir), cwd=tmp_path, env=cli_env())
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    each_iteration_once_with_one_sampler_replaced(metrics(run_dir), iterations=3, samplers=2)


@pytest.mark.slow
def test_a_colocated_run_replaces_its_only_sampler_in_the_sampler_s_bundle(tmp_path: Path):
    # One learner and its sampler in one bundle, and no CPU left outside it for a sampler: the replacement of the
    # sampler killed mid-rollout can start only in the bundle its predecessor held.
    colocated = ["trainer.iterations=2", "trainer.placement=colocated", "sampler.envs_per_sampler=2", "ray.num_cpus=2"]
    proc, log = start_train(tmp_path, "colocated", colocated)
    try:
        await_rollout(proc, log, 0)
        kill_actor_process(proc, "SamplerActor")
        assert proc.wait(timeout=600) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            kill_tree(proc)
    each_iteration_once_with_one_sampler_replaced(metrics(tmp_path / "runs" / "colocated"), iterations=2, samplers=1)

"""The run directory: resolved config, metrics, trajectories and checkpoints (format in ARCHITECTURE.md)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from agentgym_rl.actors.trajectory import Trajectory
from agentgym_rl.configs import Config, dump_config

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
TRAINER_STATE = "trainer.json"
# Where the learner writes the Hugging Face policy inside a checkpoint directory.
POLICY_DIR = "policy"


class RunDir:
    """Paths and writers of one run directory ``<run.dir>/<run.name>``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.trajectories = path / "trajectories"
        self.checkpoints = path / "checkpoints"
        self.metrics = path / METRICS_FILE

    def create(self, config: Config) -> None:
        self.trajectories.mkdir(parents=True, exist_ok=True)
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        (self.path / CONFIG_FILE).write_text(dump_config(config))

    def append_metrics(self, record: dict) -> None:
        with self.metrics.open("a") as handle:
            handle.write(json.dumps(record, sort_keys=True) + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def read_metrics(self) -> list[dict]:
        if not self.metrics.exists():
            return []
        return [json.loads(line) for line in self.metrics.read_text().splitlines() if line.strip()]

    def keep_metrics_before(self, iteration: int) -> None:
        """Drop metric lines of ``iteration`` and later (work a resumed run will redo)."""
        kept = [r for r in self.read_metrics() if r["iteration"] < iteration]
        self.metrics.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))

    def write_trajectories(self, iteration: int, trajectories: Iterable[Trajectory]) -> Path:
        target = self.trajectories / f"iter_{iteration:06d}.jsonl"
        with target.open("w") as handle:
            for trajectory in trajectories:
                handle.write(trajectory.model_dump_json() + "\n")
        return target

    def checkpoint_dir(self, iterations_done: int) -> Path:
        return self.checkpoints / f"iter_{iterations_done:06d}"

    def staging_dir(self, iterations_done: int) -> Path:
        """Where a checkpoint is written before ``publish_checkpoint`` renames it into place."""
        staging = self.checkpoints / f".iter_{iterations_done:06d}.partial"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        return staging

    def publish_checkpoint(self, staging: Path, iterations_done: int, trainer_state: dict) -> Path:
        """Write the trainer state last, then rename: a checkpoint directory is complete or absent."""
        (staging / TRAINER_STATE).write_text(json.dumps(trainer_state, sort_keys=True))
        target = self.checkpoint_dir(iterations_done)
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
        return target

    def complete_checkpoints(self) -> list[Path]:
        """Complete checkpoints, oldest first (a staging folder or a folder without trainer state is not one)."""
        return sorted(p for p in self.checkpoints.glob("iter_*") if (p / TRAINER_STATE).is_file())

    def prune_checkpoints(self, keep: int) -> list[Path]:
        """Delete all but the newest ``keep`` complete checkpoints (``keep=0``: delete none); returns the deleted."""
        complete = self.complete_checkpoints()
        doomed = complete[:-keep] if keep and len(complete) > keep else []
        for path in doomed:
            shutil.rmtree(path, ignore_errors=True)
        return doomed

    def latest_checkpoint(self) -> Path | None:
        complete = self.complete_checkpoints()
        return complete[-1] if complete else None


def latest_if_run(folder: Path) -> Path:
    """``folder``'s latest complete checkpoint when ``folder`` is a run directory (it holds the run's config and
    ``checkpoints/``), else ``folder`` itself.

    Raises:
        FileNotFoundError: a run directory without a complete checkpoint.
    """
    if not ((folder / CONFIG_FILE).is_file() and (folder / "checkpoints").is_dir()):
        return folder
    latest = RunDir(folder).latest_checkpoint()
    if latest is None:
        raise FileNotFoundError(f"{folder}: run directory without a complete checkpoint")
    return latest

"""The run directory: resolved config, metrics, trajectories and checkpoints (format in ARCHITECTURE.md)."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterable
from pathlib import Path

import structlog

from agentgym_rl.actors.checkpoints import (
    POLICY_DIR,
    TRAINER_STATE,
    CheckpointError,
    checkpoint_damage,
    policy_damage_of,
    write_manifest,
)
from agentgym_rl.actors.trajectory import Trajectory
from agentgym_rl.configs import Config, dump_config

__all__ = ["CONFIG_FILE", "METRICS_FILE", "POLICY_DIR", "TRAINER_STATE", "RunDir", "latest_if_run"]

log = structlog.get_logger()

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
# Where `--from` moves the checkpoints newer than the one a run goes back to (kept, never deleted).
SUPERSEDED_DIR = "superseded"
# A checkpoint whose check (reading and hashing every byte) is worth a log line first.
LARGE_CHECKPOINT_BYTES = 2**30


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
        """Write the trainer state and then the manifest (every file's size and sha256) last, then rename: a
        checkpoint directory is complete or absent, and a resume can tell whether it was damaged since."""
        (staging / TRAINER_STATE).write_text(json.dumps(trainer_state, sort_keys=True))
        write_manifest(staging)
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

    def resume_checkpoint(self, wanted: str | None = None) -> Path | None:
        """The checkpoint a resume loads, checked whole before anything loads it: ``wanted`` (``iter_N``,
        ``N`` or the checkpoint's path), else the latest complete one; None when the run has none yet.

        Raises:
            CheckpointError: ``wanted`` is not a complete checkpoint of this run, or the checkpoint is damaged
                (the message names the damaged part and the ``--from`` that goes back to an earlier one).
        """
        complete = self.complete_checkpoints()
        names = ", ".join(p.name for p in complete) or "none"
        if wanted is None:
            if not complete:
                return None
            checkpoint = complete[-1]
        elif not self.checkpoints.is_dir():
            raise CheckpointError(
                f"--from {wanted}: {self.path} holds no checkpoints/; give a run directory made by train"
            )
        else:
            match = re.fullmatch(r"(?:iter_)?(\d+)", Path(wanted).name)
            checkpoint = self.checkpoint_dir(int(match.group(1))) if match else None
            if checkpoint not in complete:
                raise CheckpointError(
                    f"--from {wanted}: not a complete checkpoint of {self.path}; complete ones: {names}"
                )
        size = sum(p.stat().st_size for p in checkpoint.rglob("*") if p.is_file())
        if size > LARGE_CHECKPOINT_BYTES:  # hashing reads every byte: say why the start waits
            log.info("checking the checkpoint's files", checkpoint=str(checkpoint), gib=round(size / 2**30, 1))
        problem = checkpoint_damage(checkpoint)
        if problem is None:
            return checkpoint
        earlier = complete[: complete.index(checkpoint)]
        way_on = (
            f"resume from the one before with --resume {self.path} --from {earlier[-1].name}"
            if earlier
            else "the run has no earlier checkpoint: start it again under another run.name"
        )
        raise CheckpointError(f"checkpoint {checkpoint} is damaged: {problem}; {way_on}")

    def set_aside_after(self, checkpoint: Path) -> list[Path]:
        """Move the complete checkpoints newer than ``checkpoint`` into ``checkpoints/superseded/``, so the run
        continues from ``checkpoint`` (nothing is deleted); returns where they went."""
        newer = [p for p in self.complete_checkpoints() if p.name > checkpoint.name]
        moved = []
        for path in newer:
            target = self.checkpoints / SUPERSEDED_DIR / path.name
            suffix = 1
            while target.exists():  # set aside before, by an earlier --from
                target = self.checkpoints / SUPERSEDED_DIR / f"{path.name}.{suffix}"
                suffix += 1
            target.parent.mkdir(exist_ok=True)
            path.rename(target)
            moved.append(target)
        if moved:
            log.warning("set aside the checkpoints after the one resumed from", kept_in=[str(p) for p in moved])
        return moved


def latest_if_run(folder: Path) -> Path:
    """``folder``'s latest complete checkpoint when ``folder`` is a run directory (it holds the run's config and
    ``checkpoints/``), else ``folder`` itself; a checkpoint's policy is checked before it is returned.

    Raises:
        FileNotFoundError: a run directory without a complete checkpoint.
        CheckpointError: the checkpoint's policy is damaged (the message names the part).
    """
    if (folder / CONFIG_FILE).is_file() and (folder / "checkpoints").is_dir():
        latest = RunDir(folder).latest_checkpoint()
        if latest is None:
            raise FileNotFoundError(f"{folder}: run directory without a complete checkpoint")
        folder = latest
    if (folder / TRAINER_STATE).is_file():  # a checkpoint, not a model or adapter directory
        problem = policy_damage_of(folder)
        if problem:
            raise CheckpointError(
                f"checkpoint {folder} is damaged: {problem}; give another of its run's checkpoints/iter_N"
            )
    return folder

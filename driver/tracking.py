"""What the run records besides metrics.jsonl: the kept trajectories and Weights & Biases logging.

``select_trajectories`` keeps trajectory files small (``logging.max_trajectories_per_iteration``);
``wandb_tracker`` opens a W&B run when ``logging.wandb.enabled`` (offline by default, so no network).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from agentgym_rl.actors.rundir import RunDir
from agentgym_rl.actors.trajectory import Trajectory
from agentgym_rl.configs import Config

log = structlog.get_logger()

EPISODE_COLUMNS = ["iteration", "env", "task_id", "group", "reward", "success", "truncated", "turns", "conversation"]
# Characters of one conversation kept in the W&B episodes table.
CONVERSATION_CHARS = 4000


def select_trajectories(trajectories: Sequence[Trajectory], limit: int, seed: int, iteration: int) -> list[Trajectory]:
    """At most ``limit`` trajectories (0 = all), in their original order.

    Successes are kept first; the rest of the budget goes to failures drawn uniformly with a
    generator seeded by ``(seed, iteration)``, so the choice is the same on a rerun or a resume and
    does not consume any other RNG stream. If successes alone exceed ``limit``, they are drawn the
    same way.
    """
    if limit == 0 or len(trajectories) <= limit:
        return list(trajectories)
    rng = np.random.default_rng([seed, iteration])
    successes = [i for i, t in enumerate(trajectories) if t.success]
    failures = [i for i, t in enumerate(trajectories) if not t.success]
    if len(successes) >= limit:
        kept = rng.choice(successes, size=limit, replace=False).tolist()
    else:
        kept = successes + rng.choice(failures, size=limit - len(successes), replace=False).tolist()
    return [trajectories[i] for i in sorted(kept)]


def conversation_text(trajectory: Trajectory) -> str:
    """The episode as ``role: content`` blocks, cut to ``CONVERSATION_CHARS``."""
    text = "\n\n".join(f"{m['role']}: {m['content']}" for m in trajectory.messages)
    return text[:CONVERSATION_CHARS]


class WandbTracker:
    """One W&B run for one training run: per-iteration metrics, horizon changes, an episodes table."""

    def __init__(self, config: Config, run_dir: RunDir) -> None:
        import wandb  # imported here: runs without W&B never pay for the import

        settings = config.logging.wandb
        directory = Path(settings.dir) if settings.dir else run_dir.path
        directory.mkdir(parents=True, exist_ok=True)
        self.config = config
        self.wandb = wandb
        self.run = wandb.init(
            project=settings.project,
            entity=settings.entity,
            mode=settings.mode,
            dir=str(directory),
            name=config.run.name,
            config=config.model_dump(mode="json"),
            # The console belongs to the progress display and structlog; W&B must not wrap it.
            settings=wandb.Settings(console="off", silent=True),
        )
        self.horizon: int | None = None
        log.info("wandb run started", mode=settings.mode, dir=str(self.run.dir))

    def log_iteration(self, record: dict[str, Any], trajectories: Sequence[Trajectory]) -> None:
        """Log one metrics.jsonl record (numbers only), a horizon change, and a few episodes."""
        iteration = int(record["iteration"])
        data: dict[str, Any] = {
            key: value
            for key, value in record.items()
            if isinstance(value, int | float) and not isinstance(value, bool) and key != "iteration"
        }
        horizon = record.get("horizon")  # none in offline mode, which plays no episodes
        if horizon is not None and horizon != self.horizon:
            data["curriculum/horizon_change"] = horizon
            self.run.summary[f"curriculum/horizon_from_iteration_{iteration}"] = horizon
            self.horizon = horizon
        count = self.config.logging.wandb.episodes_per_iteration
        if count:
            picked = select_trajectories(trajectories, count, self.config.run.seed, iteration)
            rows = [
                [
                    iteration,
                    t.env,
                    t.task_id,
                    t.group,
                    t.reward,
                    t.success,
                    t.truncated,
                    t.num_turns,
                    conversation_text(t),
                ]
                for t in picked
            ]
            data["episodes"] = self.wandb.Table(columns=EPISODE_COLUMNS, data=rows)
        self.run.log(data, step=iteration)

    def finish(self, failed: bool) -> None:
        self.run.finish(exit_code=1 if failed else 0)


@contextmanager
def wandb_tracker(config: Config, run_dir: RunDir) -> Iterator[WandbTracker | None]:
    """A ``WandbTracker`` while training when ``logging.wandb.enabled``, else None; finishes the run on exit."""
    if not config.logging.wandb.enabled:
        yield None
        return
    tracker = WandbTracker(config, run_dir)
    failed = True
    try:
        yield tracker
        failed = False
    finally:
        tracker.finish(failed)

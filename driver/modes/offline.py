"""``trainer.mode: offline``: train on logged trajectories (``data.files``) without any rollout.

Each iteration draws ``trainer.tasks_per_iteration`` distinct tasks (``(env, task_id)``) from the
data with the run seed and updates the learner on all of their episodes, so the episodes of a
task (the pairs of ``dpo``) always arrive together. Metrics, checkpoints and resume follow the
run-directory layout of the sync trainer.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict

import ray
import structlog
from agentgym_rl.actors.models import model_dir
from agentgym_rl.actors.rundir import TRAINER_STATE, RunDir
from agentgym_rl.actors.trajectory import Trajectory
from agentgym_rl.configs import Config
from agentgym_rl.driver.data import load_trajectories
from agentgym_rl.driver.errors import TrainError
from agentgym_rl.driver.learners import start_learners, total_updates
from agentgym_rl.driver.metrics import rollout_metrics
from agentgym_rl.driver.tasks import TaskSchedule

log = structlog.get_logger()


class OfflineTrainer:
    """Drives ``trainer.iterations`` updates on logged trajectories.

    Args:
        config: the resolved run config (``trainer.mode: offline``).
        run_dir: the run directory.
        resume: continue from the latest complete checkpoint in ``run_dir``.
    """

    def __init__(self, config: Config, run_dir: RunDir, *, resume: bool = False) -> None:
        self.config = config
        self.run_dir = run_dir
        self.resume = resume
        data = [t for t in load_trajectories(config.data.files) if not t.failed]
        by_task: dict[tuple[str, int], list[Trajectory]] = defaultdict(list)
        for trajectory in data:
            by_task[(trajectory.env, trajectory.task_id)].append(trajectory)
        self.tasks = list(by_task.values())
        if not self.tasks:
            raise TrainError(f"data.files {config.data.files} hold no trajectories")
        self.schedule = TaskSchedule(list(range(len(self.tasks))), config.trainer.tasks_per_iteration, config.run.seed)
        log.info("offline data", episodes=len(data), tasks=len(self.tasks), files=config.data.files)

    def run(self) -> dict:
        """Train to ``trainer.iterations``; returns the last iteration's metrics."""
        cfg = self.config
        structlog.contextvars.bind_contextvars(run=cfg.run.name)
        model_dir(cfg.model.name)
        self.learners = start_learners(cfg, total_updates(cfg))
        start = self._restore() if self.resume else 0
        last: dict = {}
        for iteration in range(start, cfg.trainer.iterations):
            structlog.contextvars.bind_contextvars(iteration=iteration)
            started = time.perf_counter()
            # Groups are numbered per iteration, as in a rollout; each episode is put in the object
            # store once and every learner reads it from there.
            batch = [
                t.model_copy(update={"group": group})
                for group, task in enumerate(self.schedule.next())
                for t in self.tasks[task]
            ]
            refs = [ray.put(t) for t in batch]
            metrics = ray.get([lr.update.remote(refs) for lr in self.learners])[0]
            record = {
                "iteration": iteration,
                **rollout_metrics(batch),
                **metrics,
                "time/iteration_s": time.perf_counter() - started,
            }
            self.run_dir.append_metrics(record)
            log.info("iteration done", loss=round(record.get("learner/loss", 0.0), 5), episodes=len(batch))
            done = iteration + 1
            if done % cfg.trainer.checkpoint_every == 0 or done == cfg.trainer.iterations:
                self._checkpoint(done)
            last = record
        structlog.contextvars.unbind_contextvars("iteration")
        return last

    def _checkpoint(self, iterations_done: int) -> None:
        staging = self.run_dir.staging_dir(iterations_done)
        ray.get([lr.save_checkpoint.remote(str(staging)) for lr in self.learners])
        state = {"iterations_done": iterations_done, "task_schedule": self.schedule.state()}
        path = self.run_dir.publish_checkpoint(staging, iterations_done, state)
        log.info("checkpoint saved", path=str(path))

    def _restore(self) -> int:
        checkpoint = self.run_dir.latest_checkpoint()
        if checkpoint is None:
            self.run_dir.keep_metrics_before(0)
            return 0
        state = json.loads((checkpoint / TRAINER_STATE).read_text())
        ray.get([lr.load_checkpoint.remote(str(checkpoint)) for lr in self.learners])
        self.schedule.load_state(state["task_schedule"])
        self.run_dir.keep_metrics_before(state["iterations_done"])
        log.info("resumed", checkpoint=str(checkpoint), iteration=state["iterations_done"])
        return state["iterations_done"]

"""``trainer.mode: offline``: train on logged trajectories (``data.files``) without any rollout.

Each iteration draws ``trainer.tasks_per_iteration`` distinct tasks (``(env, task_id)``) from the
data with the run seed and updates the learner on all of their episodes, so the episodes of a
task (the pairs of ``dpo``) always arrive together. The trainer records, checkpoints, prunes, serves
and tracks these iterations as in every other mode.
"""

from __future__ import annotations

import time
from collections import defaultdict

import ray
import structlog
from typing_extensions import override

from agentgym_rl.actors.rundir import RunDir
from agentgym_rl.actors.trajectory import Trajectory
from agentgym_rl.configs import Config
from agentgym_rl.driver.data import load_trajectories
from agentgym_rl.driver.errors import TrainError
from agentgym_rl.driver.metrics import rollout_metrics
from agentgym_rl.driver.tasks import TaskSchedule
from agentgym_rl.driver.trainer import Display, Step, Trainer

log = structlog.get_logger()


class OfflineTrainer(Trainer):
    """Trains on logged trajectories: learners only, no samplers, env actors or curriculum.

    Args:
        config: the resolved run config (``trainer.mode: offline``).
        run_dir: the run directory.
        resume: continue from the latest complete checkpoint in ``run_dir``.
    """

    plays_episodes = False

    def __init__(self, config: Config, run_dir: RunDir, *, resume: bool = False) -> None:
        super().__init__(config, run_dir, resume=resume)
        data = [t for t in load_trajectories(config.data.files) if not t.failed]
        by_task: dict[tuple[str, int], list[Trajectory]] = defaultdict(list)
        for trajectory in data:
            by_task[(trajectory.env, trajectory.task_id)].append(trajectory)
        self.tasks = list(by_task.values())
        if not self.tasks:
            raise TrainError(f"data.files {config.data.files} hold no trajectories")
        self.schedule = TaskSchedule(list(range(len(self.tasks))), config.trainer.tasks_per_iteration, config.run.seed)
        log.info("offline data", episodes=len(data), tasks=len(self.tasks), files=config.data.files)

    @override
    def checkpoint_state(self) -> dict:
        """The draw of logged tasks."""
        return {"task_schedule": self.schedule.state()}

    @override
    def load_checkpoint_state(self, state: dict) -> None:
        self.schedule.load_state(state["task_schedule"])

    @override
    def step(self, iteration: int, display: Display) -> Step:
        started = time.perf_counter()
        # Groups are numbered per iteration, as in a rollout; each episode is put in the object
        # store once and every learner reads it from there.
        batch = [
            t.model_copy(update={"group": group})
            for group, task in enumerate(self.schedule.next())
            for t in self.tasks[task]
        ]
        learner_metrics = self.learner_group.update([ray.put(t) for t in batch])
        sync_s = self.sync_weights(iteration)  # only a serving endpoint reads the weights
        record = {
            "iteration": iteration,
            **rollout_metrics(batch),
            **learner_metrics,
            "time/sync_s": sync_s,
            "sync/bytes": self.sent_bytes if sync_s else 0,
            "time/iteration_s": time.perf_counter() - started,
        }
        return Step(record, batch, [], {"episodes": len(batch)})

"""``trainer.mode: agentevol``: AgentEvol (Xi et al. 2024, AgentGym) as rounds of self-improvement.

Each round the current policy explores ``agentevol.tasks_per_round`` training tasks
``agentevol.samples_per_task`` times; the episodes that pass the filter join the episodes kept in
earlier rounds (and the logged ``data.files``, e.g. expert demonstrations), and the policy is
fine-tuned (``sft``, ``learner.epochs`` passes) on that merged set. Every round is a metrics line
(``iteration`` = round) with the exploration's success rate, optionally a held-out test-split
success rate, and a checkpoint.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Literal

import ray
import structlog
from typing_extensions import override

from agentgym_rl.actors.rundir import RunDir
from agentgym_rl.actors.trajectory import Trajectory
from agentgym_rl.configs import Config
from agentgym_rl.driver.data import load_trajectories
from agentgym_rl.driver.metrics import rollout_metrics, split_failed
from agentgym_rl.driver.trainer import Display, Step, Trainer
from agentgym_rl.envs import make

log = structlog.get_logger()

# Group ids of evaluation episodes, far from the exploration groups so their seeds never collide.
EVAL_GROUP_OFFSET = 1_000_000


def filter_episodes(trajectories: Sequence[Trajectory], mode: Literal["success", "top_k"], k: int) -> list[int]:
    """Indices of the episodes AgentEvol keeps, in input order.

    ``success``: every successful episode. ``top_k``: per task (``env``, ``task_id``), the ``k``
    episodes with the highest reward among those with reward > 0 (ties keep input order).
    """
    if mode == "success":
        return [i for i, t in enumerate(trajectories) if t.success]
    by_task: dict[tuple[str, int], list[int]] = defaultdict(list)
    for i, t in enumerate(trajectories):
        if t.reward > 0:
            by_task[(t.env, t.task_id)].append(i)
    kept = [i for members in by_task.values() for i in sorted(members, key=lambda i: -trajectories[i].reward)[:k]]
    return sorted(kept)


class AgentEvolTrainer(Trainer):
    """AgentEvol's rounds as the trainer's iterations (``samples_per_task`` as the group size,
    ``tasks_per_round`` tasks per iteration, a checkpoint every round).

    Args:
        config: the resolved run config (``trainer.mode: agentevol``, ``algorithm.name: sft``).
        run_dir: the run directory.
        resume: continue from the latest complete checkpoint; the kept episodes of earlier rounds
            are re-read from ``trajectories/`` (complete when ``logging.max_trajectories_per_iteration``
            keeps every success, e.g. 0).
    """

    def __init__(self, config: Config, run_dir: RunDir, *, resume: bool = False) -> None:
        self.evol = config.agentevol
        rounds = config.model_copy(deep=True)
        rounds.algorithm.group_size = self.evol.samples_per_task
        rounds.trainer.tasks_per_iteration = self.evol.tasks_per_round
        rounds.trainer.iterations = self.evol.rounds
        rounds.trainer.checkpoint_every = 1  # a resume re-reads the kept episodes of the rounds before it
        super().__init__(rounds, run_dir, resume=resume)
        self.seed_data = load_trajectories(config.data.files) if config.data.files else []
        self.test_tasks = self._test_tasks()

    def _test_tasks(self) -> list[int]:
        if self.evol.eval_tasks == 0:
            return []
        env = make(self.config.env.name, self.config.env.options)
        try:
            return list(env.tasks("test"))[: self.evol.eval_tasks]
        finally:
            env.close()

    def _evaluate(self, round_index: int, tasks: list[int]) -> float:
        """Success rate of the current policy on ``tasks``, one episode each, through the sampler pool."""
        pending = self.rollouts.launch_groups(round_index, [tasks], first_group=EVAL_GROUP_OFFSET, group_size=1)
        _, episodes = self.rollouts.await_rollout(pending, round_index, None)
        played = [t for t in episodes if not t.failed]
        return sum(t.success for t in played) / max(len(played), 1)

    def _kept_before(self, round_index: int) -> list[ray.ObjectRef]:
        """The filtered episodes of rounds before ``round_index``, re-read from the run directory."""
        kept = []
        for r in range(round_index):
            path = self.run_dir.trajectories / f"iter_{r:06d}.jsonl"
            explored = load_trajectories([str(path)]) if path.is_file() else []
            kept += [ray.put(explored[i]) for i in filter_episodes(explored, self.evol.filter, self.evol.k)]
        return kept

    @override
    def prepare(self, iteration: int) -> None:
        self.dataset = [ray.put(t) for t in self.seed_data] + self._kept_before(iteration)

    @override
    def step(self, iteration: int, display: Display) -> Step:
        evol = self.evol
        started = time.perf_counter()
        horizons = self.rollouts.start_horizons(iteration)
        refs, played = self.rollouts.rollout(iteration, display.progress)
        reports, _ = self.rollouts.env_reports(played, horizons)
        refs, explored, failed = split_failed(refs, played)
        rollout_s = time.perf_counter() - started
        kept = filter_episodes(explored, evol.filter, evol.k)
        self.dataset += [refs[i] for i in kept]
        learner_metrics = self.learner_group.update(self.dataset)
        sync_s = self.sync_weights(iteration)
        record = {
            "iteration": iteration,
            "horizon": max(horizons),
            "weights_version": self.weights_version,
            **rollout_metrics(explored, failed),
            "agentevol/kept": float(len(kept)),
            "agentevol/dataset": float(len(self.dataset)),
            **learner_metrics,
            "time/rollout_s": rollout_s,
            "time/sync_s": sync_s,
            "sync/bytes": self.sent_bytes if sync_s else 0,
        }
        if self.test_tasks:
            record["eval/test_success_rate"] = self._evaluate(iteration, self.test_tasks)
        record["time/iteration_s"] = time.perf_counter() - started
        fields = {
            "kept": len(kept),
            "dataset": len(self.dataset),
            "test_success_rate": record.get("eval/test_success_rate"),
        }
        return Step(record, explored, reports, fields)

"""The async driver loop (``trainer.mode: async``): rollout runs ahead of training.

While the learner trains on iteration k, the samplers already play iterations k+1 .. k+max_staleness
(their collect calls are launched before the driver waits on the update). When the update ends its
weights are pushed to the samplers, which swap them in between two generation batches, so an episode
may straddle a swap: a trajectory records the *oldest* version that sampled any of its replies, and
staleness is judged by it. A trajectory more than ``max_staleness`` versions behind the learner is
dropped (``rollout/dropped_stale``); with this pipeline depth that only happens when a weight push
did not land (the guard keeps the bound whatever the timing). The learner uses the sampler's
log-probs as ratio denominators (``learner.old_logprobs: sampler``, enforced by the config).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import ray
import structlog
from typing_extensions import override

from agentgym_rl.actors.trajectory import Trajectory
from agentgym_rl.driver.metrics import rollout_metrics, split_failed
from agentgym_rl.driver.trainer import Display, Step, Trainer

log = structlog.get_logger()


@dataclass
class Launch:
    """One iteration's rollout in flight."""

    iteration: int
    horizons: list[int]  # each env's, in env order
    pending: dict[ray.ObjectRef, tuple[int, int]]
    schedule_states: list[dict]  # each env's task draw before this launch drew its tasks (what a resume replays)
    started: float


def drop_stale(
    refs: list[ray.ObjectRef], trajectories: list[Trajectory], learner_version: int, max_staleness: int
) -> tuple[list[ray.ObjectRef], list[Trajectory], int]:
    """Keep the trajectories at most ``max_staleness`` versions behind ``learner_version``; returns them
    and how many were dropped."""
    kept = [
        (ref, t)
        for ref, t in zip(refs, trajectories, strict=True)
        if learner_version - t.weights_version <= max_staleness
    ]
    return [ref for ref, _ in kept], [t for _, t in kept], len(trajectories) - len(kept)


class AsyncTrainer(Trainer):
    """Rollout overlapped with training; same actors, run directory and checkpoints as the sync mode.

    A checkpoint taken while later rollouts are in flight records the task schedule as it was before
    they were launched, so a resume replays those iterations (with their seeds) instead of skipping them.
    """

    @override
    def prepare(self, iteration: int) -> None:
        # After a learner restart the rollouts in flight belong to iterations that are played again.
        self.inflight: deque[Launch] = deque()
        self.next_launch = iteration
        log.info("async training", max_staleness=self.config.trainer.max_staleness)

    def _launch(self, iteration: int) -> Launch:
        schedule_states = self.rollouts.task_draws()
        horizons = self.rollouts.start_horizons(iteration)
        return Launch(
            iteration, horizons, self.rollouts.launch_rollout(iteration), schedule_states, time.perf_counter()
        )

    @override
    def save_checkpoint(self, iterations_done: int) -> Path:
        current = self.rollouts.task_draws()
        if self.inflight:
            self.rollouts.load_task_draws(self.inflight[0].schedule_states)
        try:
            return super().save_checkpoint(iterations_done)
        finally:
            self.rollouts.load_task_draws(current)

    @override
    def step(self, iteration: int, display: Display) -> Step:
        cfg = self.config
        depth = cfg.trainer.max_staleness
        if not self.inflight:
            self.inflight.append(self._launch(self.next_launch))
            self.next_launch += 1
        launch = self.inflight.popleft()
        waited = time.perf_counter()
        refs, trajectories = self.rollouts.await_rollout(launch.pending, iteration, display.progress)
        rollout_wait_s = time.perf_counter() - waited
        rollout_s = time.perf_counter() - launch.started
        lost = [t for t in trajectories if t.failed]
        refs, trajectories, failed = split_failed(refs, trajectories)
        learner_version = self.weights_version
        refs, trajectories, dropped = drop_stale(refs, trajectories, learner_version, depth)
        # per env over the same episodes as the overall keys: the kept ones (and the failed, counted)
        reports, env_keys = self.rollouts.env_reports([*trajectories, *lost], launch.horizons)
        update_started = time.perf_counter()
        updates = self.learner_group.start_update(refs) if refs else []
        # The next rollouts start before the update is awaited: this is the overlap.
        while len(self.inflight) < depth and self.next_launch < cfg.trainer.iterations:
            self.inflight.append(self._launch(self.next_launch))
            self.next_launch += 1
        learner_metrics = self.learner_group.finish_update(updates) if updates else {}
        update_wait_s = time.perf_counter() - update_started
        sync_s = self.sync_weights(iteration)
        record = {
            "iteration": iteration,
            "horizon": max(launch.horizons),
            "weights_version": self.weights_version,
            **rollout_metrics(trajectories, failed),
            **env_keys,
            "rollout/dropped_stale": float(dropped),
            "rollout/learner_version": float(learner_version),
            "rollout/staleness_max": float(max((learner_version - t.weights_version for t in trajectories), default=0)),
            **learner_metrics,
            "time/rollout_s": rollout_s,
            "time/rollout_wait_s": rollout_wait_s,
            "time/update_wait_s": update_wait_s,
            "time/sync_s": sync_s,
            "sync/bytes": self.sent_bytes if sync_s else 0,
            "time/iteration_s": rollout_wait_s + update_wait_s + sync_s,
        }
        return Step(record, trajectories, reports, {"dropped_stale": dropped, "failed": failed})

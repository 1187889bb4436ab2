"""``trainer.mode: sync``: each iteration plays its episodes, then trains on them, then syncs the weights."""

from __future__ import annotations

import time

from typing_extensions import override

from agentgym_rl.driver.metrics import group_metrics, rollout_metrics, split_failed
from agentgym_rl.driver.trainer import Display, Step, Trainer


class SyncTrainer(Trainer):
    """Rollout, update and weight sync one after the other (the warm start trains this way too)."""

    @override
    def step(self, iteration: int, display: Display) -> Step:
        cfg = self.config
        started = time.perf_counter()
        horizons = self.rollouts.start_horizons(iteration)
        refs, trajectories = self.rollouts.rollout(iteration, display.progress)
        sampling: dict[str, float] = {}
        if cfg.trainer.dynamic_sampling.enabled:
            refs, trajectories, sampling = self.rollouts.refill(iteration, refs, trajectories, display.progress)
        reports, env_keys = self.rollouts.env_reports(trajectories, horizons)
        refs, trajectories, failed = split_failed(refs, trajectories)
        rollout_s = time.perf_counter() - started
        learner_metrics = self.learner_group.update(refs) if refs else {}
        # No optimizer step (e.g. every group uninformative): the samplers already have these weights.
        sync_s = self.sync_weights(iteration) if learner_metrics.get("learner/optimizer_steps") else 0.0
        record = {
            "iteration": iteration,
            "horizon": max(horizons),
            "weights_version": self.weights_version,
            **rollout_metrics(trajectories, failed),
            **group_metrics(self.algorithm, trajectories),
            **sampling,
            **env_keys,
            **learner_metrics,
            "time/rollout_s": rollout_s,
            "time/sync_s": sync_s,
            "sync/bytes": self.sent_bytes if sync_s else 0,
            "time/iteration_s": time.perf_counter() - started,
        }
        return Step(record, trajectories, reports)

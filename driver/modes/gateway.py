"""``trainer.mode: gateway``: the run serves the policy and trains on the episodes its clients record.

Clients (agents written in any framework) play through the endpoint's episode routes
(``serve.episodes``). Each iteration collects the closed episodes from the endpoint's episode book,
groups them by the clients' group keys, and trains once ``trainer.tasks_per_iteration`` groups hold
``algorithm.group_size`` episodes each (an episode whose client rewrote its history brings all its segments,
and counts once), or after ``trainer.gateway.timeout_s`` with at least one such
group; the new weights then hot-swap into the replicas. An episode whose oldest reply was sampled more
than ``trainer.max_staleness`` versions before the learner's is dropped (``rollout/dropped_stale``), as
is one whose history the client changed (the book never hands those out). Episodes of a group beyond
``group_size``, and incomplete groups, wait for a later iteration; checkpoints keep them.
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
from agentgym_rl.driver.metrics import group_metrics, rollout_metrics
from agentgym_rl.driver.trainer import Display, Step, Trainer

log = structlog.get_logger()


class GatewayTrainer(Trainer):
    """Learners and the endpoint only: no samplers, env actors or curriculum (the clients play)."""

    plays_episodes = False

    def __init__(self, config: Config, run_dir: RunDir, *, resume: bool = False) -> None:
        super().__init__(config, run_dir, resume=resume)
        self.waiting: dict[str, list[Trajectory]] = defaultdict(list)  # harvested episodes by group key

    @override
    def checkpoint_state(self) -> dict:
        """The harvested episodes still waiting for the rest of their group (they have left the endpoint's book,
        so the checkpoint is the only place they survive a restart)."""
        return {"waiting": {key: [t.model_dump(mode="json") for t in members] for key, members in self.waiting.items()}}

    @override
    def load_checkpoint_state(self, state: dict) -> None:
        """Restore the waiting episodes ``checkpoint_state`` stored. After a learner restart this process still holds
        the episodes harvested since that checkpoint: they wait too, after the checkpoint's (an episode trained
        on after the checkpoint and harvested after it is gone with the update that used it). Episodes still in
        the book of an endpoint that stopped (open, or closed and not harvested) are not part of a checkpoint."""
        restored = defaultdict(list)
        for key, members in state.get("waiting", {}).items():  # none in checkpoints written before they were kept
            restored[key] = [Trajectory.model_validate(member) for member in members]
        for key, members in self.waiting.items():
            restored[key] += [t for t in members if t not in restored[key]]
        self.waiting = restored

    @override
    def start_serving(self) -> None:
        # Imported here, as the base class imports Ray Serve: only runs that serve need it.
        from agentgym_rl.serve.app import APP_NAME
        from agentgym_rl.serve.deployment import STORE_NAMESPACE, episodes_name

        super().start_serving()
        self.book = ray.get_actor(episodes_name(APP_NAME), namespace=STORE_NAMESPACE)

    @override
    def step(self, iteration: int, display: Display) -> Step:
        started = time.perf_counter()
        groups, dropped = self._collect(iteration)
        wait_s = time.perf_counter() - started
        # Groups are numbered per iteration, as in a rollout; each episode goes to the object store once.
        batch = [t.model_copy(update={"group": number}) for number, members in enumerate(groups) for t in members]
        learner_metrics = self.learner_group.update([ray.put(t) for t in batch])
        sync_s = self.sync_weights(iteration) if learner_metrics.get("learner/optimizer_steps") else 0.0
        book = ray.get(self.book.stats.remote())
        record = {
            "iteration": iteration,
            "weights_version": self.weights_version,
            **rollout_metrics(batch),
            **group_metrics(self.algorithm, batch),
            **learner_metrics,
            "rollout/dropped_stale": float(dropped),
            "episodes/waiting": float(sum(episodes_in(members) for members in self.waiting.values())),
            **{f"episodes/{key}": float(value) for key, value in book.items()},
            "time/rollout_s": wait_s,
            "time/sync_s": sync_s,
            "sync/bytes": self.sent_bytes if sync_s else 0,
            "time/iteration_s": time.perf_counter() - started,
        }
        return Step(record, batch, [], {"episodes": len(batch), "groups": len(groups)})

    def _collect(self, iteration: int) -> tuple[list[list[Trajectory]], int]:
        """Wait for this iteration's groups (see the module docstring); returns them and the stale episodes
        dropped meanwhile."""
        cfg = self.config
        size, wanted = cfg.algorithm.group_size, cfg.trainer.tasks_per_iteration
        deadline = time.monotonic() + cfg.trainer.gateway.timeout_s
        dropped = 0
        while True:
            for key, trajectory in ray.get(self.book.harvest.remote()):
                if trajectory.weights_version < self.weights_version - cfg.trainer.max_staleness:
                    dropped += 1
                else:
                    self.waiting[key].append(trajectory)
            full = [key for key, members in self.waiting.items() if episodes_in(members) >= size]
            if len(full) >= wanted or (full and time.monotonic() >= deadline):
                break
            time.sleep(cfg.trainer.gateway.poll_s)
        groups = []
        for key in full[:wanted]:  # the groups completed first
            taken, self.waiting[key] = first_episodes(self.waiting[key], size)
            groups.append(taken)
            if not self.waiting[key]:
                del self.waiting[key]
        log.info("episodes collected", iteration=iteration, groups=len(groups), dropped_stale=dropped)
        return groups, dropped


def episodes_in(members: list[Trajectory]) -> int:
    """How many episodes ``members`` hold (an episode's segments follow its first, ``segment`` 0)."""
    return sum(member.segment == 0 for member in members)


def first_episodes(members: list[Trajectory], count: int) -> tuple[list[Trajectory], list[Trajectory]]:
    """The first ``count`` episodes of ``members`` with all their segments, and the rest."""
    starts = [index for index, member in enumerate(members) if member.segment == 0]
    cut = starts[count] if count < len(starts) else len(members)
    return members[:cut], members[cut:]

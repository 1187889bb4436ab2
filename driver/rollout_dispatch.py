"""Rollout dispatch: the run's envs (each a slot: its task draw and its curriculum), their horizons, and what an
iteration plays: its task groups launched on the ``SamplerGroup`` and awaited, refills for dynamic sampling, and
each env's report to its curriculum."""

from __future__ import annotations

import ray
import structlog
from pydantic import ValidationError
from rich.progress import Progress

from agentgym_rl.actors.cluster import Colocation, on_this_node
from agentgym_rl.actors.curriculum import CurriculumActor
from agentgym_rl.actors.sampler import EpisodeRequest
from agentgym_rl.actors.trajectory import Trajectory
from agentgym_rl.configs import Config
from agentgym_rl.configs.loader import format_validation_error
from agentgym_rl.configs.schema import MixEntry
from agentgym_rl.driver.errors import TrainError
from agentgym_rl.driver.metrics import informative_groups, rollout_metrics
from agentgym_rl.driver.mix import EnvSlot, apportion, env_metrics, env_run_config, mix_entries, schedule_seed
from agentgym_rl.driver.samplers import PoolError, SamplerGroup
from agentgym_rl.driver.tasks import TaskSchedule, episode_seed
from agentgym_rl.envs import EnvError, TextEnv, make
from agentgym_rl.learner.algorithms import Algorithm

log = structlog.get_logger()

# A collect call in flight (its ``SamplerGroup`` id) -> (env index, task group); what ``launch_groups`` returns
# and ``await_rollout`` takes.
Pending = dict[int, tuple[int, int]]


class RolloutDispatch:
    """The envs of a run and the episodes played on their samplers.

    No slot exists before ``open`` (and none in a mode that plays no episodes): every method then has nothing
    to do.

    Args:
        config: the resolved run config.
        algorithm: the driver's instance of the run's algorithm: which task groups it would skip (dynamic
            sampling).
        samplers: the run's sampler group, which plays every episode (one pool per env, in env order).
    """

    def __init__(self, config: Config, algorithm: Algorithm, samplers: SamplerGroup) -> None:
        self.config = config
        self.algorithm = algorithm
        self.samplers = samplers
        self.slots: list[EnvSlot] = []  # each env's task draw and curriculum, once opened
        self.horizons: list[int] = []  # each env's horizon for the episodes launched next (``start_horizons``)

    @property
    def mixed(self) -> bool:
        """Whether the run trains on a mix of envs (``envs``) rather than on ``env`` alone."""
        return bool(self.config.envs)

    def open(self) -> None:
        """Read every env's training tasks, share ``trainer.tasks_per_iteration`` among the envs and start each env's
        curriculum; the sampler pools start with ``start_pools``.

        Raises:
            TrainError: an env of ``envs`` cannot be made (a one-env run raises the env's own error).
        """
        entries = mix_entries(self.config)
        shares = apportion(self.config.trainer.tasks_per_iteration, [entry.weight for entry in entries])
        self.slots = [self._new_slot(i, entry, n) for i, (entry, n) in enumerate(zip(entries, shares, strict=True))]

    def _new_slot(self, index: int, entry: MixEntry, per_iteration: int) -> EnvSlot:
        """Env ``index`` of the run: its task draw and its curriculum."""
        source = f"envs[{index}]" if self.mixed else "env"
        try:
            env = make(entry.name, entry.options)
        except ValidationError as exc:  # the env's Options model refused them: name the keys, not a traceback
            raise TrainError(format_validation_error(exc, f"{source}.options of env {entry.name}")) from None
        except EnvError as exc:
            if not self.mixed:
                raise
            raise TrainError(f"{source} ({entry.name}): {exc}") from exc
        warn_without_state_keys(self.algorithm, env, entry.name)
        try:
            tasks = list(env.tasks(entry.split))
        finally:
            env.close()
        schedule = TaskSchedule(tasks, per_iteration, schedule_seed(self.config.run.seed, index), source=source)
        derived = env_run_config(self.config, entry)
        # Beside the driver: losing it would lose the horizon schedule, so it shares only the driver's fate.
        curriculum = ray.remote(CurriculumActor).options(num_cpus=0, **on_this_node()).remote(derived.curriculum)
        return EnvSlot(name=entry.name, config=derived, schedule=schedule, curriculum=curriculum)

    def start_pools(self, plans: list[list[int]], *, bundles: Colocation | None) -> None:
        """Start each env's samplers by its plan (``driver.needs.plan_run``).

        Args:
            plans: each env's env actors per sampler, in env order.
            bundles: colocated mode: the learners' bundles, sampler i going into learner i's (else None).

        Raises:
            TrainError: a pool could not start.
        """
        try:
            self.samplers.start([slot.config for slot in self.slots], plans, bundles=bundles)
        except PoolError as exc:
            raise TrainError(str(exc)) from exc

    def describe(self) -> dict:
        """The start-up log's numbers of the rollout side."""
        cfg = self.config
        described = {
            "samplers": len(self.samplers.samplers),
            "env_actors": self.samplers.env_actors(),
            "episodes_per_iteration": cfg.trainer.tasks_per_iteration * cfg.algorithm.group_size,
            "max_tokens_per_iteration": (
                cfg.trainer.tasks_per_iteration * cfg.algorithm.group_size * cfg.sampler.max_context_tokens
            ),
            "train_tasks": sum(len(slot.schedule.tasks) for slot in self.slots),
        }
        if self.mixed:
            described["tasks_per_env"] = {slot.name: slot.schedule.per_iteration for slot in self.slots}
        return described

    # ----------------------------------------------------------------------------- an iteration's episodes

    def start_horizons(self, iteration: int) -> list[int]:
        """Move every env's curriculum to ``iteration``; returns each env's horizon, in env order, which the episodes
        launched from now on carry in their requests."""
        results = ray.get([slot.curriculum.start_iteration.remote(iteration) for slot in self.slots])
        for slot, result in zip(self.slots, results, strict=True):
            if result["changed"]:
                log.info("horizon changed", env=slot.name, horizon=result["horizon"])
        self.horizons = [result["horizon"] for result in results]
        return self.horizons

    def rollout(self, iteration: int, progress: Progress | None) -> tuple[list[ray.ObjectRef], list[Trajectory]]:
        """Play this iteration's task groups; returns the trajectory refs and the trajectories, by group."""
        return self.await_rollout(self.launch_rollout(iteration), iteration, progress)

    def launch_rollout(self, iteration: int) -> Pending:
        """Check the pools (this is the iteration boundary: they shrink to the live actors and grow into
        new room), draw this iteration's tasks of every env and start their episodes; returns each collect
        call's (env index, group). Groups are numbered across envs (env 0's tasks first), so every task
        of the iteration has its own group and episode seeds."""
        try:
            self.samplers.refresh(iteration)
        except PoolError as exc:
            raise TrainError(str(exc)) from exc
        pending = self.launch_groups(iteration, [slot.schedule.next() for slot in self.slots], first_group=0)
        samplers, env_actors = len(self.samplers.samplers), self.samplers.env_actors()
        log.info("rollout started", samplers=samplers, env_actors=env_actors, groups=len(pending))
        return pending

    def launch_groups(
        self, iteration: int, tasks: list[list[int]], *, first_group: int, group_size: int | None = None
    ) -> Pending:
        """Start ``group_size`` episodes (default: ``algorithm.group_size``) of each of ``tasks[i]`` (env i's tasks)
        on env i's samplers at env i's horizon (``start_horizons``), groups numbered from ``first_group`` on;
        returns each collect call's (env index, group). Every training episode is submitted to the sampler group here."""
        group_size = group_size or self.config.algorithm.group_size
        pending = {}
        group = first_group
        for index, env_tasks in enumerate(tasks):
            for task_id in env_tasks:
                requests = [
                    EpisodeRequest(
                        task_id=task_id,
                        group=group,
                        seed=episode_seed(self.config.run.seed, iteration, group, k),
                        horizon=self.horizons[index],
                    )
                    for k in range(group_size)
                ]
                pending[self.samplers.submit(requests, env=index)] = (index, group)
                group += 1
        return pending

    def refill(
        self, iteration: int, refs: list[ray.ObjectRef], trajectories: list[Trajectory], progress: Progress | None
    ) -> tuple[list[ray.ObjectRef], list[Trajectory], dict[str, float]]:
        """Dynamic sampling: play more tasks until every env has its share of informative groups (ones the
        algorithm keeps) or ``trainer.dynamic_sampling.max_extra_tasks`` more were drawn; returns every
        episode played and the ``rollout/`` metrics of the refill."""
        budget = self.config.trainer.dynamic_sampling.max_extra_tasks
        extra = 0
        while True:
            informative = informative_groups(self.algorithm, trajectories)
            deficits = [
                slot.schedule.per_iteration - len({t.group for t in trajectories if t.env == slot.name} & informative)
                for slot in self.slots
            ]
            if extra >= budget or all(d <= 0 for d in deficits):
                break
            draws = []
            for slot, deficit in zip(self.slots, deficits, strict=True):
                count = min(max(deficit, 0), budget - extra)
                extra += count
                played = frozenset(t.task_id for t in trajectories if t.env == slot.name)
                draws.append(slot.schedule.next(count, exclude=played) if count else [])
            first_group = max(t.group for t in trajectories) + 1
            more_refs, more = self.await_rollout(
                self.launch_groups(iteration, draws, first_group=first_group), iteration, progress
            )
            refs, trajectories = refs + more_refs, trajectories + more
        return refs, trajectories, {"rollout/extra_tasks": float(extra)}

    def await_rollout(
        self, pending: Pending, iteration: int, progress: Progress | None
    ) -> tuple[list[ray.ObjectRef], list[Trajectory]]:
        """Wait for the collect calls of ``launch_groups``; returns trajectory refs and trajectories, by group.

        A call whose sampler died (before or after it returned) is played again on a survivor of the same
        env's pool (``SamplerGroup.completed``), so the iteration completes with every task group.

        Raises:
            TrainError: a pool lost its last sampler and has no room to start another.
            SamplerFailed: code inside a sampler raised (its env or engine failed).
        """
        group_size = self.config.algorithm.group_size
        bar = None
        if progress is not None:
            bar = progress.add_task(f"iteration {iteration} episodes", total=len(pending) * group_size, status="")
        calls = {call: group for call, (_, group) in pending.items()}
        by_group: dict[int, tuple[list[ray.ObjectRef], list[Trajectory]]] = {}
        try:
            for group, refs, trajectories in self.samplers.completed(calls, iteration):
                by_group[group] = (refs, trajectories)
                if bar is not None:
                    progress.advance(bar, group_size)
        except PoolError as exc:
            raise TrainError(str(exc)) from exc
        if bar is not None:
            progress.remove_task(bar)
        refs = [ref for group in sorted(by_group) for ref in by_group[group][0]]
        return refs, [t for group in sorted(by_group) for t in by_group[group][1]]

    def env_reports(self, trajectories: list[Trajectory], horizons: list[int]) -> tuple[list[dict], dict]:
        """Split an iteration's episodes (failed ones included) by env.

        Returns:
            each env's ``rollout_metrics`` (what its curriculum is told), and the ``env/<name>/*`` keys of
            the metrics record (none for a one-env run, whose overall keys say it all).
        """
        reports, keys = [], {}
        for slot, horizon in zip(self.slots, horizons, strict=True):
            own = [t for t in trajectories if t.env == slot.name]
            played = [t for t in own if not t.failed]
            reports.append(rollout_metrics(played, len(own) - len(played)))
            if self.mixed:
                keys.update(env_metrics(slot.name, reports[-1], len(played), horizon))
        return reports, keys

    def report(self, iteration: int, reports: list[dict]) -> None:
        """Tell each env's curriculum its ``env_reports`` entry (the adaptive schedule decides here; its advance
        applies from a later iteration)."""
        ray.get([slot.curriculum.report.remote(iteration, r) for slot, r in zip(self.slots, reports, strict=True)])

    # ----------------------------------------------------------------------------- state a checkpoint keeps

    def state(self) -> dict:
        """Each env's task draw and curriculum state as a checkpoint stores them: ``envs.<name>.task_schedule``
        and ``envs.<name>.curriculum``."""
        curricula = ray.get([slot.curriculum.state.remote() for slot in self.slots])
        states = {
            slot.name: {"task_schedule": slot.schedule.state(), "curriculum": curriculum}
            for slot, curriculum in zip(self.slots, curricula, strict=True)
        }
        return {"envs": states}

    def load_state(self, state: dict) -> None:
        """Restore what ``state`` returned.

        Raises:
            TrainError: ``state`` lacks an env of this run.
        """
        states = state["envs"]
        missing = [slot.name for slot in self.slots if slot.name not in states]
        if missing:
            raise TrainError(
                f"the checkpoint holds no task draw or curriculum for env(s) {missing} (it has {sorted(states)}); "
                "resume with the envs the run was started with"
            )
        for slot in self.slots:
            slot.schedule.load_state(states[slot.name]["task_schedule"])
        ray.get([slot.curriculum.load_state.remote(states[slot.name]["curriculum"]) for slot in self.slots])

    def task_draws(self) -> list[dict]:
        """Each env's task draw, in env order (what ``load_task_draws`` puts back)."""
        return [slot.schedule.state() for slot in self.slots]

    def load_task_draws(self, draws: list[dict]) -> None:
        """Put back what ``task_draws`` returned."""
        for slot, draw in zip(self.slots, draws, strict=True):
            slot.schedule.load_state(draw)

    def stop(self) -> None:
        """Kill the samplers and curricula; the env actors go with the samplers that own them."""
        self.samplers.stop()
        for slot in self.slots:
            ray.kill(slot.curriculum)


def warn_without_state_keys(algorithm: Algorithm, env: TextEnv, name: str) -> None:
    """Warn when ``algorithm`` compares turns by env state (GiGPO) but env ``name`` supplies no state keys:
    its turns then get the episode-level advantages only."""
    if algorithm.uses_state_keys and not env.has_state_key():
        log.warning(
            "env supplies no state keys: its turns get episode-level advantages only",
            env=name,
            algorithm=type(algorithm).__name__,
            fix="implement TextEnv.state_key for this env",
        )

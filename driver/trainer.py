"""The one training loop: start-up, the session (serve, progress, W&B), recording, checkpoints and their
retention, learner restarts and resume, for every mode; a mode (``driver.modes``) supplies what one iteration
does (``Trainer.step``)."""

from __future__ import annotations

import json
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import ray
import structlog
from pydantic import ValidationError
from ray.util.placement_group import remove_placement_group
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from agentgym_rl.actors.models import model_dir
from agentgym_rl.actors.pools import PoolError, SamplerPool, completed, first_line, sampler_lost
from agentgym_rl.actors.rundir import TRAINER_STATE, RunDir
from agentgym_rl.actors.sampler import EpisodeRequest
from agentgym_rl.actors.trajectory import Trajectory
from agentgym_rl.actors.transport import Transport, choose_transport
from agentgym_rl.actors.weight_sync import GroupAddress
from agentgym_rl.configs import Config
from agentgym_rl.configs.schema import MixEntry
from agentgym_rl.driver.errors import LearnerLost, TrainError
from agentgym_rl.driver.learners import LearnerGroup, start_learners, total_updates
from agentgym_rl.driver.metrics import informative_groups, pool_metrics, rollout_metrics
from agentgym_rl.driver.mix import EnvSlot, apportion, env_metrics, env_run_config, mix_entries, schedule_seed
from agentgym_rl.driver.needs import plan_run
from agentgym_rl.driver.tasks import TaskSchedule, episode_seed
from agentgym_rl.driver.tracking import WandbTracker, select_trajectories, wandb_tracker
from agentgym_rl.envs import EnvError, TextEnv, make
from agentgym_rl.learner.algorithms import Algorithm, build_algorithm

log = structlog.get_logger()


@dataclass
class Display:
    """What the training loop reports to: the progress display (if shown) and the W&B tracker (if on)."""

    progress: Progress | None
    overall: TaskID | None
    tracker: WandbTracker | None


@dataclass
class Step:
    """What one iteration produced, for the trainer to record."""

    record: dict  # the metrics line: at least iteration, success_rate, mean_reward, time/iteration_s
    trajectories: list[Trajectory]  # the episodes written to trajectories/ and shown in W&B
    reports: list[dict]  # each env's rollout metrics, in env order, for its curriculum (none without samplers)
    log_fields: dict = field(default_factory=dict)  # extra fields of the "iteration done" log line


class Trainer(ABC):
    """Creates the actors of one run and drives its iterations; each mode overrides ``step`` (and ``prepare``).

    Args:
        config: the resolved run config.
        run_dir: the run directory (created, or an existing one when resuming).
        resume: continue from the latest complete checkpoint in ``run_dir``.
    """

    def __init__(self, config: Config, run_dir: RunDir, *, resume: bool = False) -> None:
        self.config = config
        self.run_dir = run_dir
        self.resume = resume
        self.start_iteration = 0
        self.weights_version = 0
        self.learner_restarts = 0
        self.policy_server = None  # the Serve model deployment's handle when serve.enabled
        self.learner_group: LearnerGroup | None = None
        self.learners: list[ray.actor.ActorHandle] = []
        self.learner_device = "cpu"  # where the learners compute (``cpu`` or ``cuda``), from their description
        self.weight_group_members: list[ray.actor.ActorHandle] | None = None  # the samplers of the weight group
        self.transport: Transport | None = None  # how versions reach weight_group_members (``_form_weight_group``)
        self.payload: list[ray.ObjectRef] | None = None  # this version in the object store, once published
        self.sync_bytes = 0  # the size of the last version sent
        self.slots: list[EnvSlot] = []  # each env's task draw and sampler pool, once the actors started
        self.horizons: list[int] = []  # each env's horizon for the episodes launched next (``_start_horizons``)
        # The driver's own instance: which task groups the learner would skip (dynamic sampling, metrics).
        self.algorithm = build_algorithm(config.algorithm.name, config.algorithm.model_extra or {})

    @property
    def mixed(self) -> bool:
        """Whether the run trains on a mix of envs (``envs``) rather than on ``env`` alone."""
        return bool(self.config.envs)

    @property
    def samplers(self) -> list[ray.actor.ActorHandle]:
        """The live samplers of every env (the elastic pools shrink and grow during the run)."""
        return [sampler for slot in self.slots for sampler in slot.pool.samplers]

    @property
    def curriculum(self) -> ray.actor.ActorHandle:
        """The first env's curriculum actor (the only one unless ``envs`` is set; ``slots[i].pool.curriculum``
        is env i's). A pool rebuilds it with the survivors when a sampler is lost."""
        return self.slots[0].pool.curriculum

    def _new_slot(self, index: int, entry: MixEntry, per_iteration: int) -> EnvSlot:
        """Env ``index`` of the run: its task draw and its (not yet started) sampler pool."""
        cfg = self.config
        source = f"envs[{index}]" if self.mixed else "env"
        try:
            env = make(entry.name, entry.options)
        except (EnvError, ValidationError) as exc:
            if not self.mixed:
                raise
            raise TrainError(f"{source} ({entry.name}): {exc}") from exc
        warn_without_state_keys(self.algorithm, env, entry.name)
        try:
            tasks = list(env.tasks(entry.split))
        finally:
            env.close()
        schedule = TaskSchedule(tasks, per_iteration, schedule_seed(cfg.run.seed, index), source=source)
        derived = env_run_config(cfg, entry)
        return EnvSlot(
            name=entry.name,
            config=derived,
            schedule=schedule,
            pool=SamplerPool(derived, label=entry.name if self.mixed else None),
        )

    def _start_actors(self) -> None:
        cfg = self.config
        model_dir(cfg.model.name)  # build a built-in model once here, before actors race to do it
        entries = mix_entries(cfg)
        shares = apportion(cfg.trainer.tasks_per_iteration, [entry.weight for entry in entries])
        self.slots = [self._new_slot(i, entry, n) for i, (entry, n) in enumerate(zip(entries, shares, strict=True))]
        plans = plan_run(cfg)
        self._start_learners()
        # Colocated, each learner is ready (its weights and CUDA context on the GPU) before its sampler starts:
        # the engine then sizes its cache from the memory the learner left, never while the learner loads.
        described = self._describe_learner() if cfg.trainer.placement == "colocated" else None
        for slot, plan in zip(self.slots, plans, strict=True):
            slot.pool.bundles = self.learner_group.colocation  # colocated mode: sampler i in learner i's bundle
            try:
                slot.pool.start(plan)
            except PoolError as exc:
                raise TrainError(str(exc)) from exc
        # Where a learner restart goes back to while no checkpoint exists.
        self.initial_state = self._env_states()
        described = described or self._describe_learner()
        if self.mixed:
            described["tasks_per_env"] = {slot.name: slot.schedule.per_iteration for slot in self.slots}
        tokens_per_iteration = (
            cfg.trainer.tasks_per_iteration * cfg.algorithm.group_size * cfg.sampler.max_context_tokens
        )
        log.info(
            "actors ready",
            samplers=len(self.samplers),
            env_actors=sum(slot.pool.env_actors() for slot in self.slots),
            episodes_per_iteration=cfg.trainer.tasks_per_iteration * cfg.algorithm.group_size,
            max_tokens_per_iteration=tokens_per_iteration,
            train_tasks=sum(len(slot.schedule.tasks) for slot in self.slots),
            **described,
        )

    def _start_learners(self) -> None:
        self.learner_group = start_learners(self.config, total_updates(self.config))
        self.learners = self.learner_group.actors
        self.learner = self.learners[0]  # the one that publishes weights
        self.weight_group_members = None  # new learners: the next broadcast forms a new group

    def _describe_learner(self) -> dict:
        """Rank 0's description (algorithm, precision, parameters, ...) for the start-up log, once every learner
        has started."""
        try:
            described = ray.get([learner.describe.remote() for learner in self.learners])[0]
        except ray.exceptions.RayActorError as exc:
            raise self._learner_died("start-up", exc) from exc
        self.learner_device = described["device"].partition(":")[0]
        return described

    def _restore(self) -> None:
        checkpoint = self.run_dir.latest_checkpoint()
        if checkpoint is None:
            log.info("no complete checkpoint to resume from; starting at iteration 0", run=str(self.run_dir.path))
            self.run_dir.keep_metrics_before(0)
            return
        self.start_iteration = self._load_checkpoint(checkpoint)
        self.run_dir.keep_metrics_before(self.start_iteration)
        log.info("resumed", checkpoint=str(checkpoint), iteration=self.start_iteration, version=self.weights_version)

    def _load_checkpoint(self, checkpoint: Path) -> int:
        """Load ``checkpoint`` into the learners, task schedule and curriculum and push its weights to the
        samplers; returns the iterations it had done."""
        state = json.loads((checkpoint / TRAINER_STATE).read_text())
        try:
            self.weights_version = ray.get([lr.load_checkpoint.remote(str(checkpoint)) for lr in self.learners])[0]
        except ray.exceptions.RayActorError as exc:
            raise self._learner_died("a checkpoint load", exc) from exc
        self._load_env_states(state)
        self._sync_weights()
        return state["iterations_done"]

    def _env_states(self) -> dict:
        """Each env's task draw and curriculum state as a checkpoint stores them: ``envs.<name>.task_schedule``
        and ``envs.<name>.curriculum``."""
        curricula = ray.get([slot.pool.curriculum.state.remote() for slot in self.slots])
        states = {
            slot.name: {"task_schedule": slot.schedule.state(), "curriculum": curriculum}
            for slot, curriculum in zip(self.slots, curricula, strict=True)
        }
        return {"envs": states}

    def _load_env_states(self, state: dict) -> None:
        """Restore what ``_env_states`` stored (pushing the restored horizons to the samplers).

        Raises:
            TrainError: the checkpoint lacks an env of this run.
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
        ray.get([slot.pool.curriculum.load_state.remote(states[slot.name]["curriculum"]) for slot in self.slots])

    def _restart_learners(self, lost: LearnerLost) -> int:
        """Replace the learners after ``lost`` and go back to the last complete checkpoint (the run's start
        if none); returns the iteration to continue from.

        Raises:
            TrainError: the learners were already restarted ``trainer.max_learner_restarts`` times.
        """
        limit = self.config.trainer.max_learner_restarts
        if self.learner_restarts >= limit:
            raise TrainError(
                f"{lost}; the learners were restarted {self.learner_restarts} time(s) already "
                f"(trainer.max_learner_restarts={limit}); continue with --resume {self.run_dir.path}"
            )
        self.learner_restarts += 1
        log.warning("learner lost; restarting the learners", reason=str(lost), restart=self.learner_restarts)
        self.learner_group.stop()
        self._start_learners()
        checkpoint = self.run_dir.latest_checkpoint()
        try:
            if checkpoint is None:
                self._load_env_states(self.initial_state)
                self._sync_weights()
                iteration = 0
            else:
                iteration = self._load_checkpoint(checkpoint)
        except LearnerLost as again:  # a new learner died too: another restart, within the limit
            return self._restart_learners(again)
        self.run_dir.keep_metrics_before(iteration)
        log.info("learners restarted", checkpoint=str(checkpoint), iteration=iteration, version=self.weights_version)
        return iteration

    def _learner_died(self, during: str, exc: BaseException) -> Exception:
        """What a dead learner raises: ``LearnerLost`` to restart, or a ``TrainError`` that ends the run."""
        if self.config.trainer.on_learner_failure == "restart":
            return LearnerLost(f"a learner actor died during {during} ({exc.__class__.__name__})")
        latest = self.run_dir.latest_checkpoint()
        hint = f"resume with --resume {self.run_dir.path}" if latest else "no checkpoint was saved yet"
        return TrainError(
            f"a learner actor died during {during} ({exc.__class__.__name__}); {hint} "
            "(trainer.on_learner_failure=restart recovers from the last checkpoint by itself)"
        )

    def _start_serving(self) -> None:
        # Imported here: serve builds on actors, and only a run with serve.enabled needs Ray Serve.
        from agentgym_rl.serve.app import ServeArgs, ServeError, start_server

        cfg = self.config
        args = ServeArgs.for_training(cfg)  # the sampler's dtype and engine unless serve.engine is set
        try:
            self.policy_server = start_server(args)
        except ServeError as exc:
            raise TrainError(str(exc)) from exc
        log.info("serving the policy", url=f"http://{cfg.serve.host}:{cfg.serve.port}/v1", model=cfg.model.name)

    def _stop_serving(self) -> None:
        from agentgym_rl.serve.app import stop_server

        # Clients get a moment to read the final version before the endpoint goes away.
        time.sleep(self.config.serve.linger_s)
        stop_server()
        self.policy_server = None

    def _sync_weights(self, iteration: int | None = None) -> float:
        """Send the learner's weights to every sampler and the serving endpoint (``trainer.weight_sync``);
        returns the seconds it took (0 where nobody reads them: offline mode without ``serve.enabled``) and
        leaves the bytes of the version in ``self.sync_bytes``."""
        if not self.slots and self.policy_server is None:
            return 0.0
        started = time.perf_counter()
        self.payload = None  # the object store's copy of this version is published when first needed
        receivers = [(slot.pool, sampler) for slot in self.slots for sampler in slot.pool.samplers]
        for slot in self.slots:
            slot.pool.weights = self._payload_ref  # what samplers that join later load
        if receivers and self.broadcasting:
            self._broadcast_weights(receivers, iteration)
        elif receivers:
            self._load_from_object_store(receivers, iteration)
        if self.policy_server is not None:
            # The server swaps between generate batches.
            served = self.policy_server.update_weights.remote(self._payload_ref(), iteration).result()
            if not receivers:  # no samplers (offline, gateway): the endpoint holds the run's version
                self.weights_version = served
        if self.payload is not None and not (receivers and self.broadcasting):
            self.sync_bytes = ray.get(self.learner.last_published_bytes.remote())
        return time.perf_counter() - started

    @property
    def broadcasting(self) -> bool:
        """Whether versions go from the learner straight into the samplers' engines, by broadcast or CUDA IPC
        (``trainer.weight_sync.method``)."""
        method = self.config.trainer.weight_sync.method
        return method == "broadcast" or (method == "auto" and self.learner_device == "cuda")

    def _payload_ref(self) -> list[ray.ObjectRef]:
        """The current version in the object store (``[ref]``), put there by the learners on first need."""
        if self.payload is None:
            try:
                # Every learner takes part (ZeRO-3 gathers the parameters); rank 0 returns the reference.
                self.payload = ray.get([learner.publish_weights.remote() for learner in self.learners])[0]
            except ray.exceptions.RayActorError as exc:
                raise self._learner_died("the weight sync", exc) from exc
        return self.payload

    def _load_from_object_store(self, receivers: list[tuple[SamplerPool, ray.actor.ActorHandle]], iteration) -> None:
        payload_ref = self._payload_ref()
        loads = {sampler.load_weights.remote(payload_ref): (pool, sampler) for pool, sampler in receivers}
        versions = []
        for ref, (pool, sampler) in loads.items():
            try:
                versions.append(ray.get(ref))
            except ray.exceptions.RayError as exc:
                if isinstance(exc, ray.exceptions.RayTaskError) and isinstance(exc, ray.exceptions.ObjectLostError):
                    # The payload died with its owner, the learner that published it.
                    raise self._learner_died("the weight sync", exc) from exc
                if not sampler_lost(exc):
                    raise
                pool.lose(sampler, iteration, exc)
        if versions:
            self.weights_version = versions[0]

    def _broadcast_weights(self, receivers: list[tuple[SamplerPool, ray.actor.ActorHandle]], iteration) -> None:
        """Send this version from learner rank 0 straight into the samplers' engines by the transport the devices
        of both ends call for (``actors.transport.choose_transport``; chosen again, with the weight group formed
        again, when the samplers changed): CUDA IPC where every engine is on the learner's GPU, else a broadcast.
        A failed sync (a sampler lost on the way, a timeout, a group that did not form) is said in a warning and
        this version goes through the object store instead; the learner goes on."""
        cfg = self.config.trainer.weight_sync
        members = [sampler for _, sampler in receivers]
        try:
            if self.weight_group_members != members:
                self.weight_group_members = self.transport = None
                self.transport = self._form_weight_group(members)
                self.weight_group_members = members
            if self.transport == "cuda_ipc":
                versions, failures = self._share_weights(receivers, iteration)
            else:
                sends = [learner.broadcast_weights.remote(int(cfg.bucket_mb * 2**20)) for learner in self.learners]
                receives = {sampler.receive_weights.remote(): (pool, sampler) for pool, sampler in receivers}
                versions, failures = self._await_loads(receives, iteration)
                self.sync_bytes = ray.get(sends)[0]
        except ray.exceptions.RayActorError as exc:
            raise self._learner_died("the weight sync", exc) from exc
        except ray.exceptions.RayTaskError as exc:  # the group did not form, or the sender's broadcast failed
            failures = [first_line(exc)]
        if failures:
            self.weight_group_members = None  # formed again at the next sync
            log.warning(
                "weight sync failed; this version goes through the object store",
                transport=self.transport,
                reasons=failures,
            )
            live = [(pool, sampler) for pool, sampler in receivers if sampler in pool.samplers]
            self._load_from_object_store(live, iteration)
            self.sync_bytes = ray.get(self.learner.last_published_bytes.remote())
            return
        self.weights_version = versions[0]

    def _await_loads(
        self,
        loads: dict[ray.ObjectRef, tuple[SamplerPool, ray.actor.ActorHandle]],
        iteration: int,
        timeout_s: float | None = None,
    ) -> tuple[list[int], list[str]]:
        """Wait for the samplers' loads of one version, each up to ``timeout_s`` (a lost sampler leaves its pool);
        returns the versions loaded and what failed."""
        versions, failures = [], []
        for ref, (pool, sampler) in loads.items():
            try:
                versions.append(ray.get(ref, timeout=timeout_s))
            except ray.exceptions.RayError as exc:
                failures.append(first_line(exc))
                if sampler_lost(exc):
                    pool.lose(sampler, iteration, exc)
        return versions, failures

    def _share_weights(
        self, receivers: list[tuple[SamplerPool, ray.actor.ActorHandle]], iteration: int
    ) -> tuple[list[int], list[str]]:
        """CUDA IPC: learner rank 0 shares this version's tensors on its GPU and every sampler's engine, on the same
        GPU, copies them in place; rank 0 lets them go once every load has returned. Returns the versions loaded
        and what failed."""
        shared = ray.get([learner.share_weights.remote() for learner in self.learners])[0]
        try:
            loads = {sampler.load_shared_weights.remote(shared): (pool, sampler) for pool, sampler in receivers}
            # A broadcast's receivers time out by themselves (the group's timeout); these wait here.
            versions, failures = self._await_loads(loads, iteration, self.config.trainer.weight_sync.timeout_s)
        finally:
            ray.get(self.learner.release_shared_weights.remote())
        self.sync_bytes = shared.num_bytes
        return versions, failures

    def _form_weight_group(self, members: list[ray.actor.ActorHandle]) -> Transport:
        """Choose the transport from where learner rank 0 and ``members``' engines hold their tensors, and for a
        broadcast form its weight group (each engine takes one rank or more); returns the transport."""
        cfg = self.config.trainer.weight_sync
        adapter = self.config.learner.lora.enabled
        sender = ray.get(self.learner.device_identity.remote())
        identities = ray.get([sampler.weight_group_identities.remote(adapter) for sampler in members])
        transport = choose_transport(sender, [identity for own in identities for identity in own])
        if transport == "cuda_ipc":
            log.info("weights go by CUDA IPC", receivers=len(members), gpu=sender.device)
            return transport
        host, port = ray.get(self.learner.weight_group_address.remote())
        ranks = [len(own) for own in identities]
        address = GroupAddress(host, port, 1 + sum(ranks), transport, cfg.timeout_s)
        firsts = [1 + sum(ranks[:i]) for i in range(len(members))]
        joins = [self.learner.join_weight_group.remote(address)]
        joins += [sampler.join_weight_group.remote(address, first, adapter) for sampler, first in zip(members, firsts)]
        ray.get(joins)
        log.info("weight group formed", members=address.world_size, backend=transport, address=f"{host}:{port}")
        return transport

    def _rollout(self, iteration: int, progress: Progress | None) -> tuple[list[ray.ObjectRef], list[Trajectory]]:
        """Play this iteration's task groups; returns the trajectory refs and the trajectories, by group."""
        return self._await_rollout(self._launch_rollout(iteration), iteration, progress)

    def _launch_rollout(self, iteration: int) -> dict[ray.ObjectRef, tuple[int, int]]:
        """Check the pools (this is the iteration boundary: they shrink to the live actors and grow into
        new room), draw this iteration's tasks of every env and start their episodes; returns each collect
        call's (env index, group). Groups are numbered across envs (env 0's tasks first), so every task
        of the iteration has its own group and episode seeds."""
        for slot in self.slots:
            try:
                slot.pool.refresh(iteration)
            except PoolError as exc:
                raise TrainError(str(exc)) from exc
        pending = self._launch_groups(iteration, [slot.schedule.next() for slot in self.slots], first_group=0)
        log.info(
            "rollout started",
            samplers=len(self.samplers),
            env_actors=sum(slot.pool.env_actors() for slot in self.slots),
            groups=len(pending),
        )
        return pending

    def _launch_groups(
        self, iteration: int, tasks: list[list[int]], first_group: int, group_size: int | None = None
    ) -> dict[ray.ObjectRef, tuple[int, int]]:
        """Start ``group_size`` episodes (default: ``algorithm.group_size``) of each of ``tasks[i]`` (env i's tasks)
        on env i's samplers at env i's horizon (``_start_horizons``), groups numbered from ``first_group`` on;
        returns each collect call's (env index, group). Every episode of a run reaches a sampler through here."""
        group_size = group_size or self.config.algorithm.group_size
        pending = {}
        group = first_group
        for index, (slot, env_tasks) in enumerate(zip(self.slots, tasks, strict=True)):
            samplers = slot.pool.samplers
            for local, task_id in enumerate(env_tasks):
                sampler = samplers[local % len(samplers)]
                requests = [
                    EpisodeRequest(
                        task_id=task_id,
                        group=group,
                        seed=episode_seed(self.config.run.seed, iteration, group, k),
                        horizon=self.horizons[index],
                    )
                    for k in range(group_size)
                ]
                pending[slot.pool.submit(sampler, requests)] = (index, group)
                group += 1
        return pending

    def _refill(
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
            more_refs, more = self._await_rollout(
                self._launch_groups(iteration, draws, first_group), iteration, progress
            )
            refs, trajectories = refs + more_refs, trajectories + more
        return refs, trajectories, {"rollout/extra_tasks": float(extra)}

    def _await_rollout(
        self, pending: dict[ray.ObjectRef, tuple[int, int]], iteration: int, progress: Progress | None
    ) -> tuple[list[ray.ObjectRef], list[Trajectory]]:
        """Wait for the collect calls of ``_launch_groups``; returns trajectory refs and trajectories, by group.

        A call whose sampler died (before or after it returned) is played again on a survivor of the same
        env's pool (``actors.pools.completed``), so the iteration completes with every task group.
        """
        group_size = self.config.algorithm.group_size
        bar = None
        if progress is not None:
            bar = progress.add_task(f"iteration {iteration} episodes", total=len(pending) * group_size, status="")
        calls = {call: (self.slots[index].pool, group) for call, (index, group) in pending.items()}
        by_group: dict[int, tuple[list[ray.ObjectRef], list[Trajectory]]] = {}
        try:
            for group, refs, trajectories in completed(calls, iteration):
                # The call's return values, owned by this process: the learner reads these very objects, whatever
                # becomes of the sampler, and no trajectory is stored twice.
                by_group[group] = (refs, trajectories)
                if bar is not None:
                    progress.advance(bar, group_size)
        except PoolError as exc:
            raise TrainError(str(exc)) from exc
        if bar is not None:
            progress.remove_task(bar)
        refs = [ref for group in sorted(by_group) for ref in by_group[group][0]]
        return refs, [t for group in sorted(by_group) for t in by_group[group][1]]

    def _start_horizons(self, iteration: int) -> list[int]:
        """Move every env's curriculum to ``iteration`` (pushing changed horizons to its samplers); returns
        each env's horizon, in env order, which the episodes launched from now on carry in their requests."""
        results = ray.get([slot.pool.curriculum.start_iteration.remote(iteration) for slot in self.slots])
        for slot, result in zip(self.slots, results, strict=True):
            if result["changed"]:
                log.info("horizon changed", env=slot.name, horizon=result["horizon"])
        # the horizons the episodes launched from now on carry in their requests
        self.horizons = [result["horizon"] for result in results]
        return self.horizons

    def _env_reports(self, trajectories: list[Trajectory], horizons: list[int]) -> tuple[list[dict], dict]:
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

    def _update(self, refs: list[ray.ObjectRef]) -> dict:
        """Train every learner on ``refs``; returns rank 0's metrics (see ``_finish_update``). In colocated mode
        the samplers sleep meanwhile (the learners bring their optimizer state in and out themselves)."""
        if self.config.trainer.placement != "colocated":
            return self._finish_update(self._start_update(refs))
        slept = self._tell_samplers("sleep")
        try:
            metrics = self._finish_update(self._start_update(refs))
        finally:
            woke = self._tell_samplers("wake")
        return {**metrics, "time/sleep_s": slept, "time/wake_s": woke}

    def _tell_samplers(self, method: str) -> float:
        """Call ``method`` on every live sampler and wait (a lost sampler is dropped); returns the seconds."""
        started = time.perf_counter()
        calls = {getattr(s, method).remote(): (slot.pool, s) for slot in self.slots for s in slot.pool.samplers}
        for ref, (pool, sampler) in calls.items():
            try:
                ray.get(ref)
            except ray.exceptions.RayError as exc:
                if not sampler_lost(exc):
                    raise
                pool.lose(sampler, None, exc)
        return time.perf_counter() - started

    def _start_update(self, refs: list[ray.ObjectRef]) -> list[ray.ObjectRef]:
        """Start every learner's update on ``refs``; returns the calls for ``_finish_update``."""
        return [lr.update.remote(refs) for lr in self.learners]

    def _finish_update(self, calls: list[ray.ObjectRef]) -> dict:
        """Wait for ``_start_update``'s calls; returns rank 0's metrics. A dead learner ends the run with a message
        (or, with ``trainer.on_learner_failure=restart``, raises ``LearnerLost``), never a hang."""
        try:
            return ray.get(calls)[0]
        except ray.exceptions.RayActorError as exc:
            raise self._learner_died("the update", exc) from exc

    def _checkpoint(self, iterations_done: int) -> Path:
        staging = self.run_dir.staging_dir(iterations_done)
        try:
            ray.get([lr.save_checkpoint.remote(str(staging)) for lr in self.learners])
        except ray.exceptions.RayActorError as exc:
            raise self._learner_died("a checkpoint write", exc) from exc
        state = {
            "iterations_done": iterations_done,
            "weights_version": self.weights_version,
            **self._env_states(),
        }
        path = self.run_dir.publish_checkpoint(staging, iterations_done, state)
        removed = self.run_dir.prune_checkpoints(self.config.trainer.keep_checkpoints)
        log.info("checkpoint saved", path=str(path), removed=[p.name for p in removed])
        return path

    @contextmanager
    def _session(self) -> Iterator[Display]:
        """Start the actors (and the endpoint), resume if asked, and hold the progress display and
        W&B tracker around the training loop; stop serving afterwards."""
        cfg = self.config
        structlog.contextvars.bind_contextvars(run=cfg.run.name)
        self._start_actors()
        if cfg.serve.enabled:
            self._start_serving()
        if self.resume:
            self._restore()
        progress_cm = (
            Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("{task.fields[status]}"),
                transient=False,
            )
            if cfg.logging.progress
            else nullcontext()
        )
        with progress_cm as progress, wandb_tracker(cfg, self.run_dir) as tracker:
            overall = None
            if progress is not None:
                overall = progress.add_task(
                    "training", total=cfg.trainer.iterations, completed=self.start_iteration, status=""
                )
            yield Display(progress, overall, tracker)
        structlog.contextvars.unbind_contextvars("iteration")
        if self.policy_server is not None:
            self._stop_serving()

    def _record(self, display: Display, step: Step) -> None:
        """Write one finished iteration: trajectories, metrics line, each env's curriculum report, tracker, log,
        progress."""
        cfg = self.config
        record = step.record
        iteration = record["iteration"]
        record.update(pool_metrics([slot.pool.metrics(iteration) for slot in self.slots]))
        record["learner/restarts"] = float(self.learner_restarts)
        kept = select_trajectories(
            step.trajectories, cfg.logging.max_trajectories_per_iteration, cfg.run.seed, iteration
        )
        self.run_dir.write_trajectories(iteration, kept)
        self.run_dir.append_metrics(record)
        # the adaptive curriculum decides here; its advance applies from a later iteration
        ray.get(
            [slot.pool.curriculum.report.remote(iteration, r) for slot, r in zip(self.slots, step.reports, strict=True)]
        )
        if display.tracker is not None:
            display.tracker.log_iteration(record, step.trajectories)
        log.info(
            "iteration done",
            horizon=record.get("horizon"),
            success_rate=round(record["success_rate"], 3),
            mean_reward=round(record["mean_reward"], 3),
            loss=round(record.get("learner/loss", 0.0), 5),
            seconds=round(record["time/iteration_s"], 1),
            **step.log_fields,
        )
        if display.overall is not None:
            status = f"success {record['success_rate']:.2f}"
            if "horizon" in record:
                status += f" horizon {record['horizon']}"
            display.progress.update(display.overall, advance=1, status=status)

    def run(self, stop_by: float | None = None) -> dict:
        """Train to ``trainer.iterations``; returns the last iteration's metrics.

        Args:
            stop_by: a ``time.monotonic()`` deadline. The run stops early, after checkpointing the iteration just
                done (``--resume`` continues it exactly), once another iteration as long as the longest one so far
                would end past it. At least one iteration runs.
        """
        cfg = self.config
        last: dict = {}
        longest = 0.0
        with self._session() as display:
            iteration = self.start_iteration
            self.prepare(iteration)
            while iteration < cfg.trainer.iterations:
                structlog.contextvars.bind_contextvars(iteration=iteration)
                started = time.monotonic()
                try:
                    step = self.step(iteration, display)
                    self._record(display, step)
                    done = iteration + 1
                    longest = max(longest, time.monotonic() - started)
                    out_of_time = (
                        stop_by is not None and done < cfg.trainer.iterations and time.monotonic() + longest > stop_by
                    )
                    if done % cfg.trainer.checkpoint_every == 0 or done == cfg.trainer.iterations or out_of_time:
                        self._checkpoint(done)
                except LearnerLost as lost:
                    iteration = self._restart_learners(lost)
                    self.prepare(iteration)
                    if display.overall is not None:
                        display.progress.update(display.overall, completed=iteration)
                    continue
                last = step.record
                iteration = done
                if out_of_time:
                    log.info("stopping before the time limit", iterations_done=done, longest_iteration_s=round(longest))
                    break
        return last

    def prepare(self, iteration: int) -> None:
        """Called before the first ``step`` (``iteration``: where the run starts or resumes) and again after the
        learners were restarted back to ``iteration``; a mode sets up the state its steps carry across iterations."""

    @abstractmethod
    def step(self, iteration: int, display: Display) -> Step:
        """Play and train one iteration (the mode's work); the trainer records and checkpoints it."""

    def stop_actors(self) -> None:
        """Kill this run's actors; the env actors go with the samplers that own them."""
        for actor in [*self.learners, *self.samplers, *(slot.pool.curriculum for slot in self.slots)]:
            ray.kill(actor)
        if self.learner_group is not None:
            remove_placement_group(self.learner_group.placement)


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

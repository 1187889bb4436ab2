"""The one training loop: start-up, the session (serve, progress, W&B), recording, checkpoints and their
retention, learner restarts and resume, for every mode; a mode (``driver.modes``) supplies what one iteration
does (``Trainer.step``) and may override the other hooks the trainer declares.

The trainer composes three collaborators, which the modes drive through their public methods: the sampler group
(``driver.samplers``: the samplers, every episode they play, lost samplers, weight delivery), the rollout dispatch
(``driver.rollout_dispatch``: envs, task draws, horizons, an iteration's episodes on the sampler group) and the
learner group (``driver.learner_group``: updates, checkpoints, restarts, the source of each weights version).
``sync_weights`` sends each version to the samplers and the serving endpoint.
"""

from __future__ import annotations

import json
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import ray
import structlog
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from agentgym_rl.actors.model_store import model_dir
from agentgym_rl.actors.rundir import TRAINER_STATE, RunDir
from agentgym_rl.actors.trajectory import Trajectory
from agentgym_rl.configs import Config
from agentgym_rl.driver.errors import LearnerLost, TrainError
from agentgym_rl.driver.heldout import HeldOutTasks
from agentgym_rl.driver.learner_group import LearnerGroup
from agentgym_rl.driver.needs import plan_run
from agentgym_rl.driver.rollout_dispatch import RolloutDispatch
from agentgym_rl.driver.samplers import SamplerGroup
from agentgym_rl.driver.tracking import WandbTracker, select_trajectories, wandb_tracker
from agentgym_rl.learner.algorithms import build_algorithm

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


@dataclass(frozen=True)
class RunEnd:
    """How ``Trainer.run`` ended, for the command's summary line."""

    last: dict  # the last iteration's metrics line; empty when no iteration ran (the run had already finished)
    iterations: int  # the iterations the run trains to, as this mode counts them (AgentEvol: its rounds)
    stopped_early: bool  # True when ``stop_by`` ended it with iterations left (``--resume`` continues it)


class Trainer(ABC):
    """Creates the actors of one run and drives its iterations.

    A mode implements ``step`` and may override the hooks below it: ``prepare``, ``start_actors``,
    ``checkpoint_state`` and ``load_checkpoint_state``, ``save_checkpoint``, ``start_serving``; and it sets
    ``plays_episodes`` when it trains on episodes played elsewhere. Everything else is the trainer's own.

    Args:
        config: the resolved run config.
        run_dir: the run directory (created, or an existing one when resuming).
        resume: continue from the latest complete checkpoint in ``run_dir``.
    """

    # False in a mode whose episodes come from elsewhere (logged data, the endpoint's clients): its run starts
    # learners only, no samplers, env actors or curriculum.
    plays_episodes: ClassVar[bool] = True

    def __init__(self, config: Config, run_dir: RunDir, *, resume: bool = False) -> None:
        self.config = config
        self.run_dir = run_dir
        self.resume = resume
        self.start_iteration = 0
        # The driver's own instance: which task groups the learner would skip (dynamic sampling, metrics).
        self.algorithm = build_algorithm(config.algorithm.name, config.algorithm.model_extra or {})
        self.samplers = SamplerGroup(config)
        self.rollouts = RolloutDispatch(config, self.algorithm, self.samplers)
        self.learner_group = LearnerGroup(config, run_dir, self.samplers)
        # played by the loop before the steps it is due at
        self.heldout = HeldOutTasks(config, self.samplers, plays_episodes=self.plays_episodes)
        self.endpoint = None  # the Serve model deployment's handle while the run serves
        self.weights_version = 0  # the version the samplers (or, without samplers, the endpoint) hold
        self.sent_bytes = 0  # the size of the last version sent
        self.initial_state: dict = {}  # where a learner restart goes back to while no checkpoint exists

    # ----------------------------------------------------------------------------- hooks a mode may override

    @abstractmethod
    def step(self, iteration: int, display: Display) -> Step:
        """Play and train one iteration (the mode's work); the trainer records and checkpoints it."""

    def prepare(self, iteration: int) -> None:
        """Called before the first ``step`` (``iteration``: where the run starts or resumes) and again after the
        learners were restarted back to ``iteration``; a mode sets up the state its steps carry across iterations."""

    def start_actors(self) -> None:
        """Start the run's actors and log what started: the learners, and when the mode ``plays_episodes`` each
        env's samplers, env actors and curriculum; then keep ``checkpoint_state`` as ``initial_state``.

        Raises:
            TrainError: an env or a sampler pool could not start, or a learner died at start-up.
        """
        cfg = self.config
        model_dir(cfg.model.name)  # build a built-in model once here, before actors race to do it
        if not self.plays_episodes:
            self.learner_group.start()
            self.initial_state = self.checkpoint_state()
            log.info("actors ready", **self.learner_group.describe())
            return
        self.rollouts.open()
        plans = plan_run(cfg)
        self.learner_group.start()
        # Colocated, each learner is ready (its weights and CUDA context on the GPU) before its sampler starts:
        # the engine then sizes its cache from the memory the learner left, never while the learner loads.
        described = self.learner_group.describe() if cfg.trainer.placement == "colocated" else None
        self.rollouts.start_pools(plans, bundles=self.learner_group.colocation)
        self.initial_state = self.checkpoint_state()
        described = described or self.learner_group.describe()
        log.info("actors ready", **self.rollouts.describe(), **described)

    def checkpoint_state(self) -> dict:
        """What a checkpoint stores beside the learners' state (``trainer_state.json``), JSON-serialisable; by
        default each env's task draw and curriculum (``RolloutDispatch.state``)."""
        return self.rollouts.state()

    def load_checkpoint_state(self, state: dict) -> None:
        """Restore what ``checkpoint_state`` returned (from a checkpoint, or ``initial_state`` after a learner
        restart with none).

        Raises:
            TrainError: the state does not fit this run (e.g. it lacks one of its envs).
        """
        self.rollouts.load_state(state)

    def save_checkpoint(self, iterations_done: int) -> Path:
        """Write a complete checkpoint after ``iterations_done`` iterations and prune the old ones
        (``trainer.keep_checkpoints``); returns its path.

        Raises:
            TrainError: the driver does not see a file a learner wrote (``LearnerGroup.save_checkpoint``); nothing
                is published.
        """
        staging = self.run_dir.staging_dir(iterations_done)
        self.learner_group.save_checkpoint(staging)
        state = {
            "iterations_done": iterations_done,
            "weights_version": self.weights_version,
            **self.checkpoint_state(),
        }
        path = self.run_dir.publish_checkpoint(staging, iterations_done, state)
        removed = self.run_dir.prune_checkpoints(self.config.trainer.keep_checkpoints)
        log.info("checkpoint saved", path=str(path), removed=[p.name for p in removed])
        return path

    def start_serving(self) -> None:
        """Start the policy endpoint (``serve.enabled``); every weight sync then hot-swaps it.

        Raises:
            TrainError: the endpoint could not start.
        """
        # Imported here: serve builds on actors, and only a run with serve.enabled needs Ray Serve.
        from agentgym_rl.serve.app import ServeArgs, ServeError, start_server

        cfg = self.config
        args = ServeArgs.for_training(cfg)  # the sampler's dtype and engine unless serve.engine is set
        try:
            self.endpoint = start_server(args)
        except ServeError as exc:
            raise TrainError(str(exc)) from exc
        log.info("serving the policy", url=f"http://{cfg.serve.host}:{cfg.serve.port}/v1", model=cfg.model.name)

    # ----------------------------------------------------------------------------- weights

    def sync_weights(self, iteration: int | None = None) -> float:
        """Send the learners' current version to every sampler (``SamplerGroup.sync_weights``) and the serving
        endpoint; returns the seconds it took (0 where nobody reads them: offline mode without ``serve.enabled``)
        and leaves the version the samplers hold in ``weights_version`` and its bytes in ``sent_bytes``.

        Raises:
            LearnerLost | TrainError: a learner died (see ``LearnerGroup.died``).
        """
        if not self.rollouts.slots and self.endpoint is None:
            return 0.0
        started = time.perf_counter()
        self.learner_group.new_version()
        try:
            version, self.sent_bytes = self.samplers.sync_weights(self.learner_group, iteration)
        except ray.exceptions.RayActorError as exc:
            raise self.learner_group.died("the weight sync", exc) from exc
        except ray.exceptions.ObjectLostError as exc:  # the object store's copy died with the learner that put it
            raise self.learner_group.died("the weight sync", exc) from exc
        if version is not None:
            self.weights_version = version
        if self.endpoint is not None:
            # The server swaps between generate batches.
            served = self.endpoint.update_weights.remote(self.learner_group.published(), iteration).result()
            if not self.samplers.samplers:  # no samplers (offline, gateway): the endpoint holds the run's version
                self.weights_version = served
                self.sent_bytes = self.learner_group.published_bytes()
        return time.perf_counter() - started

    # ----------------------------------------------------------------------------- resume and learner restarts

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
        self.weights_version = self.learner_group.load_checkpoint(checkpoint)
        self.load_checkpoint_state(state)
        self.sync_weights()
        return state["iterations_done"]

    def _restart_learners(self, lost: LearnerLost) -> int:
        """Replace the learners after ``lost`` and go back to the last complete checkpoint (the run's start
        if none); returns the iteration to continue from.

        Raises:
            TrainError: the learners were already restarted ``trainer.max_learner_restarts`` times.
        """
        self.learner_group.restart(lost)
        self.samplers.forget_transport()
        checkpoint = self.run_dir.latest_checkpoint()
        try:
            if checkpoint is None:
                self.load_checkpoint_state(self.initial_state)
                self.sync_weights()
                iteration = 0
            else:
                iteration = self._load_checkpoint(checkpoint)
        except LearnerLost as again:  # a new learner died too: another restart, within the limit
            return self._restart_learners(again)
        self.run_dir.keep_metrics_before(iteration)
        log.info("learners restarted", checkpoint=str(checkpoint), iteration=iteration, version=self.weights_version)
        return iteration

    # ----------------------------------------------------------------------------- the loop

    def _stop_serving(self) -> None:
        from agentgym_rl.serve.app import stop_server

        # Clients get a moment to read the final version before the endpoint goes away.
        time.sleep(self.config.serve.linger_s)
        stop_server()
        self.endpoint = None

    @contextmanager
    def _session(self) -> Iterator[Display]:
        """Start the actors (and the endpoint), resume if asked, and hold the progress display and
        W&B tracker around the training loop; stop serving afterwards."""
        cfg = self.config
        structlog.contextvars.bind_contextvars(run=cfg.run.name)
        self.start_actors()
        if cfg.serve.enabled:
            self.start_serving()
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
        if self.endpoint is not None:
            self._stop_serving()

    def _record(self, display: Display, step: Step) -> None:
        """Write one finished iteration: trajectories, metrics line, each env's curriculum report, tracker, log,
        progress."""
        cfg = self.config
        record = step.record
        iteration = record["iteration"]
        record.update(self.samplers.metrics(iteration))
        record["learner/restarts"] = float(self.learner_group.restarts)
        kept = select_trajectories(
            step.trajectories, cfg.logging.max_trajectories_per_iteration, cfg.run.seed, iteration
        )
        self.run_dir.write_trajectories(iteration, kept)
        self.run_dir.append_metrics(record)
        self.rollouts.report(iteration, step.reports)
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
            status = f"{status} {self.heldout.status()}".rstrip()
            display.progress.update(display.overall, advance=1, status=status)

    def run(self, stop_by: float | None = None) -> RunEnd:
        """Train to ``trainer.iterations``; returns the last iteration's metrics and whether ``stop_by`` ended it.

        Args:
            stop_by: a ``time.monotonic()`` deadline. The run stops early, after checkpointing the iteration just
                done (``--resume`` continues it exactly), once another iteration as long as the longest one so far
                would end past it. At least one iteration runs.
        """
        cfg = self.config
        last: dict = {}
        longest = 0.0
        out_of_time = False
        with self._session() as display:
            iteration = self.start_iteration
            self.prepare(iteration)
            while iteration < cfg.trainer.iterations:
                structlog.contextvars.bind_contextvars(iteration=iteration)
                started = time.monotonic()
                try:
                    heldout = self.heldout.play(iteration, display.progress)
                    step = self.step(iteration, display)
                    step.record.update(heldout)
                    self._record(display, step)
                    done = iteration + 1
                    longest = max(longest, time.monotonic() - started)
                    out_of_time = (
                        stop_by is not None and done < cfg.trainer.iterations and time.monotonic() + longest > stop_by
                    )
                    if done % cfg.trainer.checkpoint_every == 0 or done == cfg.trainer.iterations or out_of_time:
                        self.save_checkpoint(done)
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
        return RunEnd(last, cfg.trainer.iterations, stopped_early=out_of_time)

    def stop_actors(self) -> None:
        """Kill this run's actors; the env actors go with the samplers that own them."""
        self.learner_group.stop()
        self.rollouts.stop()

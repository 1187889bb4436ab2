"""The SFT warm start: behaviour cloning of the env's oracle as the first phase of ``train``.

A small model rarely writes a well-formed action before any training, so RL on it sees no reward.
``warm_start.iterations > 0`` first runs an ordinary run of its own in ``<run>/warm_start``: the
samplers play the env's oracle (``sampler.policy: oracle``; each env's, in a multi-env run), the
learner fits it with the ``sft`` algorithm, at a fixed horizon. The RL phase then starts from that
run's final policy, which is also its reference policy for the KL term. A resumed run reuses a
finished warm start and resumes an unfinished one from its latest checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path

import structlog

from agentgym_rl.actors.curriculum import largest_horizon
from agentgym_rl.actors.rundir import POLICY_DIR, TRAINER_STATE, RunDir
from agentgym_rl.configs import Config
from agentgym_rl.configs.schema import AlgorithmConfig, CurriculumConfig
from agentgym_rl.driver.errors import TrainError
from agentgym_rl.driver.modes.sync import SyncTrainer

log = structlog.get_logger()

WARM_START_DIR = "warm_start"


def warm_start_config(config: Config) -> Config:
    """The config of the warm-start phase of ``config``: oracle demonstrations, SFT, fixed horizon. A
    multi-env run's phase plays every env of its mix, each at the largest horizon of its own schedule."""
    warm = config.warm_start
    derived = config.model_copy(deep=True)
    derived.run.name = f"{config.run.name}-{WARM_START_DIR}"
    derived.env.options = {**config.env.options, **warm.env_options}
    derived.envs = [
        entry.model_copy(
            update={
                "options": {**entry.options, **entry.warm_start_options},
                "curriculum": CurriculumConfig(
                    schedule="fixed", horizon=warm.horizon or largest_horizon(entry.curriculum or config.curriculum)
                ),
            }
        )
        for entry in config.envs
    ]
    derived.sampler.policy = "oracle"
    derived.algorithm = AlgorithmConfig(name="sft", group_size=1)
    horizons = [entry.curriculum.horizon for entry in derived.envs] or [largest_horizon(config.curriculum)]
    derived.curriculum = CurriculumConfig(schedule="fixed", horizon=warm.horizon or max(horizons))
    derived.learner.lr = warm.lr
    derived.learner.epochs = warm.epochs
    derived.learner.minibatches = warm.minibatches
    derived.learner.lr_schedule = "constant"
    derived.learner.old_logprobs = "auto"
    derived.trainer.mode = "sync"
    derived.trainer.iterations = warm.iterations
    derived.trainer.tasks_per_iteration = warm.tasks_per_iteration
    # The run's own cadence: a long warm start resumes from its latest checkpoint, not from scratch.
    derived.trainer.checkpoint_every = min(config.trainer.checkpoint_every, warm.iterations)
    derived.trainer.keep_checkpoints = 1
    derived.trainer.heldout_tasks = 0  # the run after it measures where the warm start left the policy
    derived.serve.enabled = False
    derived.logging.wandb.enabled = False
    derived.warm_start.iterations = 0
    return derived


def finished_policy(run_dir: RunDir, iterations: int) -> Path | None:
    """The warm start's final policy directory, if its last checkpoint is complete."""
    latest = run_dir.latest_checkpoint() if run_dir.checkpoints.is_dir() else None
    if latest is None or json.loads((latest / TRAINER_STATE).read_text())["iterations_done"] < iterations:
        return None
    return latest / POLICY_DIR


def run_warm_start(config: Config, run_dir: RunDir) -> Path:
    """Run (or reuse) the warm-start phase of ``config`` under ``run_dir``; returns its policy directory.

    Ray must be initialised; the phase's actors are stopped before this returns.
    """
    derived = warm_start_config(config)
    warm_dir = RunDir(run_dir.path / WARM_START_DIR)
    policy = finished_policy(warm_dir, derived.trainer.iterations)
    if policy is not None:
        log.info("warm start already done", policy=str(policy))
        return policy
    resume = warm_dir.checkpoints.is_dir() and warm_dir.latest_checkpoint() is not None
    warm_dir.create(derived)
    log.info("warm start", iterations=derived.trainer.iterations, horizon=derived.curriculum.horizon, resume=resume)
    trainer = SyncTrainer(derived, warm_dir, resume=resume)
    try:
        trainer.run()
    finally:
        trainer.stop_actors()
    policy = finished_policy(warm_dir, derived.trainer.iterations)
    if policy is None:
        raise TrainError(f"the warm start finished without a final checkpoint in {warm_dir.checkpoints}")
    return policy

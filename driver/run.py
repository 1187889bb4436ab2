"""Prepare a run (config, checks, run directory) and train it: what ``agentgym-rl train`` does."""

from __future__ import annotations

import os
import time
from pathlib import Path

import ray

from agentgym_rl.actors.adapters import AdapterError, is_adapter_dir, read_checked_adapter
from agentgym_rl.actors.chat import ChatFormat
from agentgym_rl.actors.cluster import SHUTDOWN_GRACE_S, deadline, init_ray
from agentgym_rl.actors.model_store import load_tokenizer
from agentgym_rl.actors.rundir import CONFIG_FILE, RunDir
from agentgym_rl.actors.tool_formats import ToolChat, ToolFormatError, tool_format
from agentgym_rl.configs import Config, ConfigError, load_config
from agentgym_rl.driver.errors import TrainError
from agentgym_rl.driver.mix import check_envs, mix_entries
from agentgym_rl.driver.modes.agentevol import AgentEvolTrainer
from agentgym_rl.driver.modes.asynchronous import AsyncTrainer
from agentgym_rl.driver.modes.gateway import GatewayTrainer
from agentgym_rl.driver.modes.offline import OfflineTrainer
from agentgym_rl.driver.modes.sync import SyncTrainer
from agentgym_rl.driver.needs import plan_run
from agentgym_rl.driver.plan import check_memory
from agentgym_rl.driver.trainer import RunEnd, Trainer
from agentgym_rl.driver.warm_start import run_warm_start
from agentgym_rl.learner.algorithms import AlgorithmConfigError, build_algorithm, resolve_algorithm

# trainer.mode -> the Trainer that runs it
MODES: dict[str, type[Trainer]] = {
    "sync": SyncTrainer,
    "async": AsyncTrainer,
    "offline": OfflineTrainer,
    "agentevol": AgentEvolTrainer,
    "gateway": GatewayTrainer,
}


def algorithm_keys(name: str) -> set[str] | None:
    """The hyperparameter keys of algorithm ``name`` (its ``Config`` fields), or None for a name that does not
    resolve (``check_algorithm`` reports it)."""
    try:
        return set(resolve_algorithm(name).Config.model_fields)
    except AlgorithmConfigError:
        return None


def check_algorithm(config: Config) -> None:
    """Validate the algorithm section against the chosen algorithm before anything starts."""
    try:
        algorithm = build_algorithm(config.algorithm.name, config.algorithm.model_extra or {})
    except AlgorithmConfigError as exc:
        raise ConfigError(f"invalid config: {exc}") from None
    if config.trainer.dynamic_sampling.enabled and not algorithm.skips_uninformative_groups:
        raise ConfigError(
            f"invalid config: trainer.dynamic_sampling.enabled refills groups that the algorithm would skip, but "
            f"{config.algorithm.name!r} skips none (grpo, rloo, gigpo, gspo and cispo do with "
            "skip_uniform_groups=true, dpo always); set trainer.dynamic_sampling.enabled=false"
        )
    if algorithm.corrects_rollout_mismatch and config.learner.old_logprobs == "sampler":
        raise ConfigError(
            "invalid config: algorithm.rollout_correction weighs tokens by the learner's old log-probs against "
            "the sampler's, but learner.old_logprobs=sampler (async mode sets it) makes them the same; set "
            "algorithm.rollout_correction=none, or train in sync mode with learner.old_logprobs auto or recompute"
        )


def check_adapter(config: Config) -> None:
    """A ``model.adapter`` must be an adapter directory trained on ``model.name``; checked before any actor starts."""
    if config.model.adapter is not None:
        try:
            read_checked_adapter(config.model.adapter, config.model.name)
        except AdapterError as exc:
            raise ConfigError(
                f"invalid config: model.adapter={config.model.adapter!r}: {exc}; or set model.adapter=null to train "
                "the base model without it"
            ) from None


def prepare_run(config_path: str | None, overrides: list[str], resume: str | None) -> tuple[Config, RunDir]:
    """Resolve the config and run directory for ``train``.

    A fresh run refuses an existing run directory that already holds metrics; ``resume`` reads the
    run's saved config (overrides still apply, e.g. to raise ``trainer.iterations``). The run directory's path
    is made absolute here, against the driver's working directory, before any actor is given it: a learner on
    another node, or under another working directory, would place a relative path elsewhere.
    """
    if resume:
        path = Path(os.path.abspath(resume))
        if not (path / CONFIG_FILE).is_file():
            raise TrainError(f"--resume {resume}: no {CONFIG_FILE} there; give a run directory made by train")
        config = load_config(path / CONFIG_FILE, overrides, algorithm_keys=algorithm_keys)
        check_algorithm(config)
        check_envs(config)
        check_adapter(config)
        check_memory(config)
        run_dir = RunDir(path)
        run_dir.create(config)
        return config, run_dir
    config = load_config(config_path, overrides, algorithm_keys=algorithm_keys)
    check_algorithm(config)
    check_envs(config)
    check_adapter(config)
    check_memory(config)  # before any directory, Ray or actor: a run too big for its GPUs is refused here
    if config.run.name is None:
        config.run.name = f"{'mix' if config.envs else config.env.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    config.run.dir = os.path.abspath(config.run.dir)  # not resolve(): symlinks are each node's own
    run_dir = RunDir(Path(config.run.dir) / config.run.name)
    if run_dir.metrics.exists() and run_dir.metrics.stat().st_size > 0:
        raise TrainError(
            f"run directory {run_dir.path} already holds a run; continue it with --resume {run_dir.path} "
            "or choose another name with --set run.name=NAME"
        )
    run_dir.create(config)
    return config, run_dir


def train(config: Config, run_dir: RunDir, *, resume: bool = False, stop_by: float | None = None) -> RunEnd:
    """Run training in a local or remote Ray instance and shut the local one down afterwards; ``stop_by``: see
    ``Trainer.run`` (a warm start, if any, runs whole before it is first checked)."""
    # Fail before any actor starts when the model's chat template cannot be extended token-exactly, or, for an env
    # played in tool format, when the tool format is unknown or the template asked for cannot render it.
    chat = ChatFormat(load_tokenizer(config.model.name))
    if any(entry.action_format == "tools" for entry in mix_entries(config)):
        try:
            ToolChat(chat, tool_format(config.model.tool_format), config.model.tool_template)
        except ToolFormatError as exc:
            raise ConfigError(f"invalid config: model.tool_format: {exc}") from None
    init_ray(config)
    try:
        plan_run(config)  # before any actor starts: a run that cannot fit fails now, not after a start timeout
        if config.warm_start.iterations:
            policy = run_warm_start(config, run_dir)
            config = config.model_copy(deep=True)
            if is_adapter_dir(policy):  # a LoRA warm start: RL goes on training its adapter over the same base
                config.model.adapter = str(policy)
            else:
                config.model.name = str(policy)
        return MODES[config.trainer.mode](config, run_dir, resume=resume).run(stop_by)
    finally:
        with deadline(SHUTDOWN_GRACE_S, "the shutdown of Ray", exit_code=1):
            ray.shutdown()

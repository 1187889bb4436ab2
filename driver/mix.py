"""Multi-env training (``envs``): which envs a run trains on, how every iteration's tasks are shared among
them, and each env's slice of the metrics.

A run with ``envs`` empty trains on ``env`` alone; it is the one-entry case of the same code: one
``EnvSlot`` whose derived config is the run's config, whose task draw uses the run seed and whose
metrics are the run's overall ones (no ``env/<name>/*`` keys, today's checkpoint format).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING

import numpy as np
from pydantic import ValidationError

from agentgym_rl.configs import Config, ConfigError
from agentgym_rl.configs.schema import EnvConfig, MixEntry
from agentgym_rl.envs import EnvError, env_class, names

if TYPE_CHECKING:
    import ray

    from agentgym_rl.driver.tasks import TaskSchedule

# The per-env metrics of a mixed run, each written as ``env/<name>/<key>``.
ENV_METRIC_KEYS = ("success_rate", "mean_reward", "horizon", "episodes", "truncated_rate")


def apportion(total: int, weights: Sequence[float]) -> list[int]:
    """Share ``total`` tasks among envs by ``weights`` (largest remainder), every env at least one.

    Each env's quota is ``total * w / sum(weights)``. It gets the whole part of its quota (at least
    one), then the seats still free go one by one to the envs furthest below their quota (ties: the
    earliest env); seats the at-least-one rule overspent are taken back from the envs furthest above
    their quota among those holding more than one. Exact arithmetic (fractions), so 0.1 + 0.2 never
    rounds a seat away.

    Example: ``apportion(10, [2, 1]) == [7, 3]``; ``apportion(3, [100, 1, 1]) == [1, 1, 1]``.

    Raises:
        ValueError: no weights, a weight that is not positive, or ``total`` below the number of envs.
    """
    if not weights:
        raise ValueError("apportion needs at least one weight")
    if any(not w > 0 for w in weights):
        raise ValueError(f"weights must be positive, got {list(weights)}")
    if total < len(weights):
        raise ValueError(f"{total} tasks cannot give each of {len(weights)} envs at least one")
    exact = [Fraction(w) for w in weights]
    quotas = [total * w / sum(exact) for w in exact]
    counts = [max(1, math.floor(q)) for q in quotas]
    while sum(counts) < total:
        i = max(range(len(counts)), key=lambda k: (quotas[k] - counts[k], -k))
        counts[i] += 1
    while sum(counts) > total:
        i = min((k for k in range(len(counts)) if counts[k] > 1), key=lambda k: (quotas[k] - counts[k], k))
        counts[i] -= 1
    return counts


def mix_entries(config: Config) -> list[MixEntry]:
    """The envs ``config`` trains on: its ``envs``, or ``env`` as a one-entry mix under the run's curriculum."""
    if config.envs:
        return list(config.envs)
    env = config.env
    return [
        MixEntry(
            name=env.name,
            weight=1.0,
            split=env.split,
            options=env.options,
            action_format=env.action_format,
            curriculum=None,
        )
    ]


def env_run_config(config: Config, entry: MixEntry) -> Config:
    """The config one env's sampler pool is built from: the run's, with ``env`` and ``curriculum`` from
    ``entry`` (the run's own config when ``entry`` is the one-entry mix of ``env``)."""
    if not config.envs:
        return config
    env = EnvConfig(name=entry.name, split=entry.split, options=entry.options, action_format=entry.action_format)
    curriculum = entry.curriculum if entry.curriculum is not None else config.curriculum
    return config.model_copy(update={"env": env, "curriculum": curriculum, "envs": []})


def schedule_seed(run_seed: int, index: int) -> int:
    """The seed of the task draw of the env at ``index`` in the mix; the first env keeps the run seed, so a
    one-env run draws the same tasks as before multi-env training existed."""
    if index == 0:
        return run_seed
    return int(np.random.SeedSequence([run_seed, index]).generate_state(1)[0])


def check_envs(config: Config) -> None:
    """Fail before anything starts when an ``envs`` entry names an env nobody registered, when ``env`` or an
    entry asks for ``action_format: tools`` on an env without functions, or when ``sampler.policy=oracle`` would
    play an env whose oracle is missing or turned off.

    Raises:
        ConfigError: naming the entry and listing the registered envs (or the envs with functions), or naming
            the oracle's option and its fix.
    """
    for index, entry in enumerate(config.envs):
        try:
            env_class(entry.name)
        except EnvError as exc:
            raise ConfigError(f"invalid config: envs[{index}].name: {exc}") from None
        check_action_format(entry.name, entry.action_format, f"envs[{index}]")
        if config.sampler.policy == "oracle":
            check_oracle(entry.name, entry.options, f"envs[{index}]")
    if not config.envs and config.env.action_format == "tools":
        check_action_format(config.env.name, "tools", "env")
    if not config.envs and config.sampler.policy == "oracle":
        check_oracle(config.env.name, config.env.options, "env")


def check_oracle(name: str, options: dict, key: str) -> None:
    """Fail when ``sampler.policy=oracle`` would play env ``name`` (the config section ``key``) but the env has no
    oracle, or ``options`` turn it off (an env whose oracle costs work at every step, BabyAI's bot or SciWorld's
    gold path, runs it only with its ``oracle`` option on).

    Raises:
        ConfigError: naming the env, the option and the fix.
    """
    try:
        cls = env_class(name)
    except EnvError:
        return  # an unknown env is reported where it is made, with the registered names
    if not cls.has_oracle():
        raise ConfigError(
            f"invalid config: sampler.policy=oracle: env {name!r} ({key}.name) has no oracle to play; set "
            "sampler.policy=model"
        )
    fields = getattr(cls, "Options", None)
    if fields is None or "oracle" not in fields.model_fields:
        return
    try:
        on = fields.model_validate(options).oracle
    except ValidationError:
        return  # bad options are reported where the env is made, naming the keys
    if not on:
        raise ConfigError(
            f"invalid config: sampler.policy=oracle plays the oracle of env {name!r}, which {key}.options.oracle=false "
            f"turns off; set {key}.options.oracle=true (or sampler.policy=model)"
        )


def check_action_format(name: str, action_format: str, key: str) -> None:
    """Fail when env ``name`` (the config section ``key``) is to be played in tool format but has no functions.

    Raises:
        ConfigError: naming the env and the registered envs that describe their actions as functions.
    """
    if action_format != "tools":
        return
    try:
        if env_class(name).has_functions():
            return
    except EnvError:
        return  # an unknown env is reported where it is made, with the registered names
    raise ConfigError(
        f"invalid config: {key}.action_format=tools: env {name!r} describes no actions as functions; envs that "
        f"do: {', '.join(envs_with_functions())}; set {key}.action_format=text"
    )


def envs_with_functions() -> list[str]:
    """The registered envs that describe their actions as functions (those that cannot be imported here aside)."""
    found = []
    for name in names():
        try:
            if env_class(name).has_functions():
                found.append(name)
        except EnvError:
            continue
    return found


def env_metrics(name: str, report: dict[str, float], episodes: int, horizon: int) -> dict[str, float]:
    """The ``env/<name>/*`` keys of one env, from its ``rollout_metrics`` (``report``), its played episode
    count and the horizon it played at."""
    prefix = f"env/{name}/"
    return {
        f"{prefix}success_rate": report["success_rate"],
        f"{prefix}mean_reward": report["mean_reward"],
        f"{prefix}horizon": horizon,
        f"{prefix}episodes": float(episodes),
        f"{prefix}truncated_rate": report["rollout/truncated_rate"],
    }


@dataclass
class EnvSlot:
    """One env of the run: its derived config, its share of each iteration's tasks, its task draw and the
    CurriculumActor that owns its horizon (its samplers are the run's ``SamplerGroup``'s pool of the same index)."""

    name: str
    config: Config
    schedule: TaskSchedule
    curriculum: ray.actor.ActorHandle

"""The warm-start phase's derived config (pure: no Ray, no model)."""

import pytest

from agentgym_rl.configs import ConfigError, load_config
from agentgym_rl.driver.warm_start import warm_start_config


def test_warm_start_plays_the_oracle_with_sft_at_the_largest_horizon():
    config = load_config(None, ["warm_start.iterations=3", "warm_start.lr=1e-4", "curriculum.horizons=[2, 5, 9]"])
    derived = warm_start_config(config)
    assert derived.sampler.policy == "oracle"
    assert derived.algorithm.name == "sft" and derived.algorithm.group_size == 1
    assert derived.curriculum.schedule == "fixed" and derived.curriculum.horizon == 9
    assert derived.trainer.iterations == 3 and derived.trainer.checkpoint_every == 3
    long = warm_start_config(load_config(None, ["warm_start.iterations=24", "trainer.checkpoint_every=5"]))
    assert long.trainer.checkpoint_every == 5 and long.trainer.keep_checkpoints == 1
    assert derived.learner.lr == 1e-4
    assert derived.env.options["oracle"] is True  # the quickstart's warm_start.env_options
    assert derived.warm_start.iterations == 0
    # the RL config itself is left as it was
    assert config.algorithm.name == "grpo" and config.sampler.policy == "model"


def test_explicit_horizon_and_env_options_win():
    config = load_config(
        None, ["warm_start.iterations=1", "warm_start.horizon=4", "warm_start.env_options={max_steps: 7}"]
    )
    derived = warm_start_config(config)
    assert derived.curriculum.horizon == 4
    assert derived.env.options["max_steps"] == 7
    assert derived.env.options["levels"] == config.env.options["levels"]


def test_warm_start_is_refused_where_there_are_no_rl_iterations():
    with pytest.raises(ConfigError, match="warm_start"):
        load_config(None, ["warm_start.iterations=2", "trainer.mode=agentevol", "algorithm.name=sft"])


def test_a_mix_warm_starts_on_every_env_at_its_own_largest_horizon_with_its_own_options():
    mix = (
        "envs=[{name: babyai, options: {test_seeds: 5}, warm_start_options: {oracle: true},"
        " curriculum: {schedule: stepwise, horizons: [2, 4], advance_every: 1}},"
        " {name: textcraft, weight: 2}]"
    )
    overrides = [mix, "warm_start.iterations=1", "warm_start.env_options={}", "curriculum.schedule=fixed"]
    config = load_config(None, [*overrides, "curriculum.horizon=7"])
    derived = warm_start_config(config)
    babyai, textcraft = derived.envs
    assert babyai.options == {"test_seeds": 5, "oracle": True} and textcraft.options == {}
    assert (babyai.curriculum.schedule, babyai.curriculum.horizon) == ("fixed", 4)
    assert (textcraft.curriculum.schedule, textcraft.curriculum.horizon) == ("fixed", 7)  # the run's schedule
    assert textcraft.weight == 2 and derived.sampler.policy == "oracle"
    # the RL phase keeps its own schedules and plays the env options without the warm start's
    assert config.envs[0].curriculum.schedule == "stepwise" and "oracle" not in config.envs[0].options
    explicit = warm_start_config(load_config(None, [*overrides, "warm_start.horizon=3"]))
    assert [entry.curriculum.horizon for entry in explicit.envs] == [3, 3]

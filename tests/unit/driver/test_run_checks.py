"""The run's config checks: the env presets of configs/ (the paper's ScalingInter-RL schedule and settings) pass
them, and an algorithm setting the mode cannot honour fails them."""

from pathlib import Path

import pytest

from agentgym_rl.configs import Config, ConfigError, load_config
from agentgym_rl.driver.run import algorithm_keys, check_adapter, check_algorithm
from tests.unit.learner.test_learner import make_learner

REPO = Path(__file__).resolve().parents[3]

PUBLISHED = {  # REFERENCE.md: ScalingInter-RL rounds and advance interval per env
    "babyai": ([6, 13, 20], 100),
    "textcraft": ([10, 20, 30], 100),
    "sciworld": ([10, 20, 30], 100),
    "search": ([5, 8, 10], 100),
}


@pytest.mark.parametrize("env", sorted(PUBLISHED))
def test_env_presets_validate_with_the_published_schedule_and_settings(env):
    config = load_config(f"configs/{env}.yaml")
    check_algorithm(config)
    assert config.env.name == env
    assert (config.curriculum.schedule, config.curriculum.horizons, config.curriculum.advance_every) == (
        "stepwise",
        *PUBLISHED[env],
    )
    assert config.trainer.iterations >= len(PUBLISHED[env][0]) * PUBLISHED[env][1]
    assert config.model.name == "/models/Qwen2.5-7B-Instruct"
    assert (config.learner.lr, config.learner.grad_clip, config.learner.backend) == (1e-6, 1.0, "deepspeed")
    assert config.algorithm.name == "grpo" and config.algorithm.group_size == 8
    extra = config.algorithm.model_extra
    assert (extra["clip_eps"], extra["kl_coef"], extra["entropy_coef"]) == (0.2, 0.001, 0.001)
    assert config.sampler.sampling.temperature == 1.0
    assert 200 <= config.sampler.sampling.max_new_tokens <= 512
    assert 16 <= config.trainer.tasks_per_iteration <= 32


def test_rollout_correction_refuses_the_samplers_own_old_logprobs():
    base = {"model": {"name": "tiny-random"}, "algorithm": {"name": "grpo", "rollout_correction": "tis"}}
    check_algorithm(Config.model_validate(base))
    with pytest.raises(ConfigError, match="rollout_correction"):
        check_algorithm(Config.model_validate({**base, "trainer": {"mode": "async"}}))


STAGES = ["grpo_stepwise", "grpo_fixed_short", "grpo_fixed_long", "gigpo_stepwise"]


@pytest.mark.parametrize("experiment", ["babyai", "search"])
@pytest.mark.parametrize("stage", STAGES)
def test_rl_stages_differ_from_the_stepwise_one_only_where_their_headers_say(experiment, stage):
    config = load_config(f"configs/{experiment}/{stage}.yaml", algorithm_keys=algorithm_keys)
    check_algorithm(config)
    stepwise = load_config(f"configs/{experiment}/grpo_stepwise.yaml", algorithm_keys=algorithm_keys)
    assert config.model.adapter == str(REPO / f"docs/results/{experiment}/sft/adapter") and config.learner.lora.enabled
    assert config.learner.lora == stepwise.learner.lora and config.trainer == stepwise.trainer
    assert config.sampler == stepwise.sampler and config.env == stepwise.env
    expected = {
        "grpo_stepwise": ("grpo", "stepwise"),
        "grpo_fixed_short": ("grpo", "fixed", 4),
        "grpo_fixed_long": ("grpo", "fixed", 10),
        "gigpo_stepwise": ("gigpo", "stepwise"),
    }[stage]
    assert (config.algorithm.name, config.curriculum.schedule) == expected[:2]
    if config.curriculum.schedule == "fixed":
        assert config.curriculum.horizon == expected[2] in stepwise.curriculum.horizons


def test_a_model_adapter_that_is_missing_or_of_another_base_fails_before_anything_starts(tmp_path):
    config = Config.model_validate({"model": {"name": "tiny-random", "adapter": str(tmp_path / "none")}})
    with pytest.raises(ConfigError, match="model.adapter=.*adapter_config.json, adapter_model.safetensors"):
        check_adapter(config)
    learner = make_learner("sft", "learner.lora.enabled=true")
    learner.save_checkpoint(str(tmp_path / "ckpt"))
    adapter = str(tmp_path / "ckpt" / "policy")
    check_adapter(Config.model_validate({"model": {"name": "tiny-random", "adapter": adapter}}))
    with pytest.raises(ConfigError, match="trained on base model 'tiny-random'"):
        check_adapter(Config.model_validate({"model": {"name": "smollm2-135m-instruct", "adapter": adapter}}))

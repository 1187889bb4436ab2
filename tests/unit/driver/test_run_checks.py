"""The run's config checks: the env presets of configs/ (the paper's ScalingInter-RL schedule and settings) pass
them, and an algorithm setting the mode cannot honour fails them."""

import pytest

from agentgym_rl.configs import Config, ConfigError, load_config
from agentgym_rl.driver.run import check_algorithm

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

"""The trainer's start-up warning for GiGPO on an env that supplies no state keys."""

import structlog

from agentgym_rl.driver.rollout_dispatch import warn_without_state_keys
from agentgym_rl.envs.target_word import TargetWordEnv
from agentgym_rl.learner.algorithms import build_algorithm
from tests.unit.envs.test_state_keys import Plain


def test_gigpo_warns_at_start_about_an_env_without_state_keys():
    with structlog.testing.capture_logs() as logs:
        warn_without_state_keys(build_algorithm("gigpo", {}), Plain(), "plain")
        warn_without_state_keys(build_algorithm("grpo", {}), Plain(), "plain")
        warn_without_state_keys(build_algorithm("gigpo", {}), TargetWordEnv(), "target-word")
    assert [(entry["log_level"], entry["env"]) for entry in logs] == [("warning", "plain")]

"""The gymnasium registration of the text envs, played with the real BabyAI env."""

from __future__ import annotations

import gymnasium
import pydantic
import pytest

import agentgym_rl.envs.gym
from agentgym_rl import envs
from agentgym_rl.envs.babyai import BabyAIEnv


def test_every_env_is_registered():
    assert [agentgym_rl.envs.gym.gym_id(name) for name in envs.names()] == agentgym_rl.envs.gym.register_all()
    for name in envs.names():
        assert agentgym_rl.envs.gym.gym_id(name) in gymnasium.registry


def test_gymnasium_make_plays_a_babyai_episode_to_success():
    actions = BabyAIEnv(levels=["GoToRedBall"]).oracle_episode(1)
    env = gymnasium.make("agentgym/babyai-v0", levels=["GoToRedBall"])
    assert isinstance(env.observation_space, gymnasium.spaces.Text)
    obs, info = env.reset(options={"task_id": 1})
    assert obs.startswith("Your goal: go to the red ball") and info["task_id"] == 1
    assert env.observation_space.contains(obs)
    for i, action in enumerate(actions):
        obs, reward, terminated, truncated, info = env.step(f"Action: {action}")
        assert env.observation_space.contains(obs)
        assert terminated == (i == len(actions) - 1) and not truncated
    assert reward > 0 and info["success"]
    env.close()


def test_reset_draws_seeded_tasks_and_time_limit_truncates():
    env = gymnasium.make("agentgym/babyai-v0", levels=["GoToRedBall"], split="test", max_episode_steps=2)
    first = [env.reset(seed=7)[1]["task_id"]] + [env.reset()[1]["task_id"] for _ in range(5)]
    again = [env.reset(seed=7)[1]["task_id"]] + [env.reset()[1]["task_id"] for _ in range(5)]
    assert first == again and set(first) <= {1, 41, 81}
    env.reset(options={"task_id": 1})
    assert env.step("Action: turn left")[3] is False
    assert env.step("Action: turn left")[3] is True  # gymnasium's TimeLimit wrapper


def test_bad_options_fail_at_make():
    with pytest.raises(pydantic.ValidationError, match="unknown BabyAI levels"):
        gymnasium.make("agentgym/babyai-v0", levels=["NoSuchLevel"])


def test_registrations_carry_each_envs_default_turn_limit():
    limits = {name: gymnasium.spec(agentgym_rl.envs.gym.gym_id(name)).max_episode_steps for name in envs.names()}
    assert {name: limits[name] for name in ("babyai", "textcraft", "sciworld", "search", "web")} == {
        "babyai": 20,
        "textcraft": 30,
        "sciworld": 30,
        "search": 30,
        "web": 15,
    }
    assert all(limits[name] == envs.env_class(name).default_max_turns for name in envs.names())


def test_textcraft_truncates_at_its_turn_limit_without_max_steps():
    env = gymnasium.make("agentgym/textcraft-v0")
    env.reset(options={"task_id": 0})
    flags = [env.step("Action: inventory")[2:4] for _ in range(30)]
    assert flags[:-1] == [(False, False)] * 29 and flags[-1] == (False, True)
    env.close()

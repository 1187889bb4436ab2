"""Slow, dying and hanging envs on real Ray actors: the other episodes go on at their own pace."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

import ray
from pydantic import BaseModel, ConfigDict, Field

from agentgym_rl.actors.sampler import EpisodeRequest, SamplerActor, start_collect
from agentgym_rl.configs import load_config
from agentgym_rl.envs.base import EnvError, InvalidAction, Observation, StepResult, TextEnv
from tests.factories import RECIPE

HORIZON = 10  # every episode's turn limit, on its request

# Env actors run in their own processes (cwd: the repository); they import this module by this name.
ENV_NAME = "tests.integration.test_slow_env:CountdownEnv"
SLOW_TASK, DYING_TASK, HANGING_TASK = 7, 8, 9


class CountdownOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    step_delay_s: float = Field(0.05, description="Sleep per step of an ordinary task.")
    slow_factor: float = Field(20.0, description="SLOW_TASK sleeps this many times longer per step.")
    turns: int = Field(3, description="Steps until the episode ends.")
    marker: str | None = Field(None, description="HANGING_TASK hangs on its first step while this file is absent.")


class CountdownEnv(TextEnv):
    """Ends after ``turns`` steps whatever the reply; some task ids are slow, die or hang."""

    name = "countdown"

    def __init__(self, **options) -> None:
        self.options = CountdownOptions(**options)
        self.task_id = -1
        self.left = 0

    @property
    def instruction(self) -> str:
        return "Reply with anything; the episode ends after a few turns."

    def tasks(self, split: str) -> Sequence[int]:
        if split not in ("train", "test"):
            raise EnvError(f"unknown split {split!r}")
        return list(range(10))

    def reset(self, task_id: int) -> Observation:
        self.task_id, self.left = task_id, self.options.turns
        return Observation(text=f"Task {task_id}: {self.left} turns left.")

    def step(self, action_text: str) -> StepResult:
        delay = self.options.step_delay_s
        if self.task_id == SLOW_TASK:
            delay *= self.options.slow_factor
        if self.task_id == DYING_TASK:
            os._exit(1)
        if self.task_id == HANGING_TASK and self.options.marker and not Path(self.options.marker).exists():
            Path(self.options.marker).touch()
            delay = 3600.0
        time.sleep(delay)
        self.left -= 1
        return StepResult(observation=f"{self.left} turns left.", reward=0.0, done=self.left == 0)

    def parse_action(self, model_text: str) -> str | InvalidAction:
        return model_text


def start_sampler(envs: int, options: dict, env_timeout_s: float = 60.0):
    config = load_config(
        RECIPE,
        [
            "model.name=tiny-random",
            f"env.name={ENV_NAME}",
            f"sampler.envs_per_sampler={envs}",
            "sampler.num_cpus=0.25",
            "sampler.num_threads=1",
            "sampler.sampling.max_new_tokens=6",
            f"sampler.env_timeout_s={env_timeout_s}",
        ],
    )
    config.env.options = options
    sampler = (
        ray.remote(SamplerActor)
        .options(num_cpus=0.25, max_concurrency=100)
        .remote(index=0, model=config.model, sampler=config.sampler, env=config.env, seed=0)
    )
    return sampler


def test_fast_episodes_finish_while_a_20x_slower_env_is_still_stepping(ray_local):
    sampler = start_sampler(4, {"step_delay_s": 0.1})
    try:
        # Warm-up: every env actor started and the model loaded, so only step times differ below.
        ray.get(start_collect(sampler, [EpisodeRequest(task_id=t, group=0, seed=t, horizon=HORIZON) for t in range(4)]))
        before = ray.get(sampler.state.remote())
        tasks = [SLOW_TASK, 1, 2, 3]
        refs = {
            start_collect(sampler, [EpisodeRequest(task_id=t, group=g, seed=g, horizon=HORIZON)])[0]: t
            for g, t in enumerate(tasks)
        }
        order = []
        waiting = list(refs)
        while waiting:
            ready, waiting = ray.wait(waiting, num_returns=1)
            order.append(refs[ready[0]])
        assert order[-1] == SLOW_TASK and sorted(order[:3]) == [1, 2, 3]
        trajectories = ray.get(list(refs))
        assert all(t.num_turns == 3 and t.done and not t.failed for t in trajectories)
        stats = ray.get(sampler.state.remote())
        # The fast episodes' turns shared decode steps (fewer steps than sampled tokens) instead of waiting for the
        # slow env.
        steps = stats["batcher_steps"] - before["batcher_steps"]
        assert steps < stats["generated_tokens"] - before["generated_tokens"]
    finally:
        ray.kill(sampler)


def test_an_env_that_dies_is_replaced_retried_once_and_recorded_as_failed(ray_local):
    sampler = start_sampler(2, {})
    try:
        refs = start_collect(
            sampler,
            [
                EpisodeRequest(task_id=DYING_TASK, group=0, seed=0, horizon=HORIZON),
                EpisodeRequest(task_id=1, group=1, seed=1, horizon=HORIZON),
            ],
        )
        dying, healthy = ray.get(refs)
        assert dying.failed and dying.token_ids == [] and dying.failure_reason.count("Actor") >= 2
        assert not healthy.failed and healthy.done and healthy.num_turns == 3
        assert ray.get(sampler.state.remote())["env_replacements"] == 2
        # the replacement actors serve the next episodes
        again = ray.get(start_collect(sampler, [EpisodeRequest(task_id=2, group=0, seed=2, horizon=HORIZON)])[0])
        assert again.done and not again.failed
    finally:
        ray.kill(sampler)


def test_a_hung_env_times_out_and_the_episode_succeeds_on_a_fresh_actor(ray_local, tmp_path: Path):
    sampler = start_sampler(1, {"marker": str(tmp_path / "hung-once")}, env_timeout_s=3.0)
    try:
        refs = start_collect(sampler, [EpisodeRequest(task_id=HANGING_TASK, group=0, seed=0, horizon=HORIZON)])
        trajectory = ray.get(refs[0])
        assert not trajectory.failed and trajectory.done and trajectory.num_turns == 3
        assert ray.get(sampler.state.remote())["env_replacements"] == 1
    finally:
        ray.kill(sampler)

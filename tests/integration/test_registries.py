"""The open registries, used as docs/how-to/write-an-engine.md and write-an-algorithm.md show them (the pages
include scripted_engine.py and reinforce_loss.py): an engine registered by name plays episodes in a real sampler
actor, and a policy loss registered by name is GRPO's surrogate in a real learner update."""

from __future__ import annotations

import pytest
import ray
import torch

from agentgym_rl.actors.sampler import EpisodeRequest, SamplerActor, start_collect
from agentgym_rl.configs import load_config
from tests.factories import RECIPE
from tests.integration import reinforce_loss  # noqa: F401 -- registers `reinforce`
from tests.integration.scripted_engine import ScriptedEngine
from tests.unit.learner.helpers import batch_of
from tests.unit.learner.test_learner import gradients, make_learner

OVERRIDES = [
    "model.name=tiny-random",
    "env.options.levels=[GoToRedBall, GoToRedBallNoDists]",
    "sampler.envs_per_sampler=1",
    "sampler.num_cpus=0.25",
    "sampler.sampling.max_new_tokens=8",
]


def test_a_registered_engine_is_accepted_by_the_config_and_plays_episodes_in_a_sampler(ray_local):
    config = load_config(RECIPE, [*OVERRIDES, "sampler.engine=scripted"])
    # The sampler runs in another process, which imports the class by the path the config keeps.
    assert config.sampler.engine == "tests.integration.scripted_engine:ScriptedEngine"
    sampler = (
        ray.remote(SamplerActor)
        .options(num_cpus=config.sampler.num_cpus, max_concurrency=100)
        .remote(index=0, model=config.model, sampler=config.sampler, env=config.env, seed=0)
    )
    try:
        episode = ray.get(start_collect(sampler, [EpisodeRequest(task_id=121, group=0, seed=1, horizon=2)])[0])
        state = ray.get(sampler.state.remote())
    finally:
        ray.kill(sampler)
    assert not episode.failed and len(episode.actions) == 2  # turning left never reaches the ball
    assert [action.strip() for action in episode.actions] == [ScriptedEngine.REPLY] * 2
    assert set(episode.logprobs) == {0.0}  # every sampled token's log-prob is the engine's
    assert state["engine_replies"] == 2


def test_a_registered_policy_loss_is_grpos_surrogate_through_algorithm_policy_loss():
    trajectories = batch_of()
    runs = {}
    for loss in ("ppo", "reinforce"):
        learner = make_learner("grpo", f"algorithm.policy_loss={loss}", "algorithm.kl_coef=0")
        assert learner.algorithm.config.policy_loss == loss
        metrics = learner.accumulate_gradients(learner.prepare(trajectories), torch.arange(len(trajectories)))
        runs[loss] = (metrics, gradients(learner))
    (ppo, ppo_grads), (reinforce, reinforce_grads) = runs["ppo"], runs["reinforce"]
    # Before any step the ratio is 1: PPO's surrogate is -A, REINFORCE's -A * log pi (log pi < 0), and both
    # have the gradient -A * grad log pi.
    assert reinforce["learner/pg_loss"] != pytest.approx(ppo["learner/pg_loss"], rel=1e-2)
    assert reinforce["learner/pg_clipfrac"] == 0.0
    assert ppo_grads.keys() == reinforce_grads.keys() and ppo_grads
    for name in ppo_grads:
        assert torch.allclose(reinforce_grads[name], ppo_grads[name], rtol=1e-3, atol=1e-6), name

"""SamplerActor on real Ray with real BabyAI env actors and tiny-random: every turn enters the engine the moment its
prompt is ready and leaves it when its own reply is done, within ``sampler.max_batch_size`` turns at once.

Replies end on a stop string the random model writes often, so within one rollout they run from one token to the
cap: a lockstep sampler would hold every short reply until its batch's longest one ended."""

from __future__ import annotations

import ray

from agentgym_rl.actors.sampler import EpisodeRequest, SamplerActor, start_collect
from agentgym_rl.configs import load_config
from agentgym_rl.envs import make
from tests.factories import RECIPE

MAX_BATCH = 2


def test_turns_join_a_running_batch_and_at_most_max_batch_size_are_in_flight(ray_local):
    config = load_config(
        RECIPE,
        [
            "model.name=tiny-random",
            "env.options.levels=[GoToObjS6]",
            "sampler.envs_per_sampler=4",
            f"sampler.max_batch_size={MAX_BATCH}",
            "sampler.num_cpus=0.25",
            "sampler.num_threads=1",
            "sampler.sampling.max_new_tokens=40",
            "sampler.sampling.stop=[e]",
        ],
    )
    sampler = (
        ray.remote(SamplerActor)
        .options(num_cpus=0.25, max_concurrency=100)
        .remote(index=0, model=config.model, sampler=config.sampler, env=config.env, seed=0)
    )
    try:
        tasks = make("babyai", {"levels": ["GoToObjS6"]}).tasks("train")[:6]
        requests = [EpisodeRequest(task_id=task, group=g, seed=500 + g, horizon=3) for g, task in enumerate(tasks)]
        trajectories = ray.get(start_collect(sampler, requests))
        state = ray.get(sampler.state.remote())
    finally:
        ray.kill(sampler)
    lengths = [end - start for t in trajectories for start, end in t.turn_spans]
    assert min(lengths) * 4 <= max(lengths)  # long-tailed: the work a lockstep batch would wait on
    assert state["turns"] == len(lengths)
    # Never more than max_batch_size turns in the engine, and that many at some point (6 episodes wanted more).
    assert state["peak_turns_in_flight"] == MAX_BATCH
    assert state["batcher_peak_rows"] == MAX_BATCH
    # Turns joined a batch another reply was decoding in (a lockstep sampler never admits one there). Which of them
    # then finished first depends on timing; tests/unit/actors/test_turns.py shows a short turn overtaking a long one.
    assert state["batcher_admitted_while_decoding"] > 0
    assert state["generated_tokens"] == sum(t.num_sampled_tokens for t in trajectories)

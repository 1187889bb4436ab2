"""Env actors that hold several env instances (``sampler.envs_per_actor``): each slot plays its own episode, the
episodes are the ones a process per instance plays, and a lost env actor costs its slots' episodes one replay.

The samplers use the modelled engine (a simulation: drawn replies, no model), which keeps the test about the env
actors; its replies depend on the episode seeds only, as a real engine's do."""

from __future__ import annotations

import time

import ray

from agentgym_rl.actors.sampler import EpisodeRequest, SamplerActor, start_collect
from agentgym_rl.configs import load_config
from agentgym_rl.envs import make
from tests.factories import RECIPE

LEVELS = "[GoToRedBall, GoToObjS6]"


def sampler_with(env_actors: int, envs_per_actor: int):
    config = load_config(
        RECIPE,
        [
            "model.name=tiny-random",
            f"env.options.levels={LEVELS}",
            "sampler.engine=modelled",
            f"sampler.envs_per_sampler={env_actors}",
            f"sampler.envs_per_actor={envs_per_actor}",
            "sampler.num_cpus=0.25",
            "sampler.env_num_cpus=0.01",
            "sampler.num_threads=1",
            "sampler.sampling.max_new_tokens=48",
            "trainer.heldout_tasks=0",
        ],
    )
    handle = (
        ray.remote(SamplerActor)
        .options(num_cpus=0.25, max_concurrency=100)
        .remote(index=0, model=config.model, sampler=config.sampler, env=config.env, seed=0)
    )
    return handle


def requests(count: int) -> list[EpisodeRequest]:
    tasks = make("babyai", {"levels": ["GoToRedBall", "GoToObjS6"]}).tasks("train")[:count]
    return [EpisodeRequest(task_id=task, group=g, seed=900 + g, horizon=4) for g, task in enumerate(tasks)]


def summary(trajectory) -> tuple:
    return (trajectory.task_id, trajectory.token_ids, trajectory.step_rewards, trajectory.failed)


def test_slots_of_one_env_actor_play_the_episodes_a_process_each_plays(ray_local):
    wanted = requests(8)
    one_each, shared = sampler_with(4, 1), sampler_with(1, 4)
    try:
        alone = ray.get(start_collect(one_each, wanted))
        together = ray.get(start_collect(shared, wanted))
        state = ray.get(shared.state.remote())
    finally:
        ray.kill(one_each)
        ray.kill(shared)
    assert [summary(t) for t in together] == [summary(t) for t in alone]
    assert not any(t.failed for t in together)
    assert (state["env_actors"], state["env_slots"]) == (1, 4)
    # four episodes in flight at once on the one actor: four turns in the engine at some point
    assert state["peak_turns_in_flight"] == 4


def test_a_lost_env_actor_replays_its_slots_episodes_once_on_its_replacement(ray_local):
    wanted = requests(8)
    reference, sampler = sampler_with(2, 4), sampler_with(2, 4)
    try:
        expected = ray.get(start_collect(reference, wanted))
        refs = start_collect(sampler, wanted)
        # Kill one env actor (its 4 slots' episodes in flight) once the first turns have been played.
        actors = ray.get(sampler.__ray_call__.remote(lambda self: list(self.envs)))
        deadline = time.monotonic() + 120
        while ray.get(sampler.state.remote())["turns"] < 4:
            assert time.monotonic() < deadline, "no turn was played"
            time.sleep(0.05)
        ray.kill(actors[0], no_restart=True)
        played = ray.get(refs)
        state = ray.get(sampler.state.remote())
    finally:
        ray.kill(reference)
        ray.kill(sampler)
    # Every episode is the one a run without the loss plays (the replay starts it again from its seed), none failed.
    assert [summary(t) for t in played] == [summary(t) for t in expected]
    assert state["env_replacements"] == 1 and state["env_actors"] == 2

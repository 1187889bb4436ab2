"""An env actor that Ray restarts after a crash refuses to step an episode it no longer has."""

import contextlib
import os
import time

import pytest
import ray

from agentgym_rl.envs.actor import EnvRestarted, create_env_actor


def actor_pid(actor) -> int:
    return ray.get(actor.__ray_call__.remote(lambda _self: os.getpid()))


def test_a_restarted_env_actor_reports_the_lost_episode_until_reset(ray_local):
    env = create_env_actor("babyai", {"levels": ["GoToRedBall"]})
    task = ray.get(env.tasks.remote("train"))[0]
    ray.get(env.reset.remote(task))
    ray.get(env.step.remote("Action: turn left"))
    before = actor_pid(env)

    ray.kill(env, no_restart=False)  # the process dies; Ray starts the actor again (max_restarts)
    deadline = time.monotonic() + 120
    while True:
        with contextlib.suppress(ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
            if actor_pid(env) != before:
                break
        assert time.monotonic() < deadline, "Ray did not restart the env actor"
        time.sleep(0.5)

    with pytest.raises(EnvRestarted, match="restarted"):
        ray.get(env.step.remote("Action: turn left"))
    with pytest.raises(EnvRestarted):
        ray.get(env.oracle_reply.remote())

    observation = ray.get(env.reset.remote(task))
    assert "go to the red ball" in observation.text.lower()
    assert ray.get(env.step.remote("Action: turn left")).observation
    ray.kill(env, no_restart=True)

"""The env actor's host: its process imports what Ray and its env need, and the few project modules that host the env
(never torch, transformers, the whole config schema, structlog or rich: each env actor is its own process, hundreds
per run); and it keeps the episodes of its slots apart."""

import json
import subprocess
import sys

import pytest

from agentgym_rl.envs.actor import EnvHost, EnvRestarted

HEAVY = ("torch", "transformers", "structlog", "rich", "yaml", "jsonschema", "agentgym_rl.configs.schema")


def test_a_babyai_env_actor_loads_none_of_the_heavy_modules():
    # Ray's worker loads YAML and jsonschema itself: what counts is what the env actor adds to Ray and the env's libraries.
    script = (
        "import json, sys\n"
        "import ray, gymnasium, minigrid\n"
        "floor = set(sys.modules)\n"
        "from agentgym_rl.envs.actor import EnvHost\n"
        "host = EnvHost('babyai', None)\n"
        "host.reset(0)\n"
        "host.step('Action: turn left')\n"
        f"print(json.dumps([name for name in {HEAVY!r} if name in set(sys.modules) - floor]))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_the_configs_package_still_offers_its_names():
    from agentgym_rl import configs

    assert configs.load_config.__module__ == "agentgym_rl.configs.loader"
    assert configs.Config.__name__ == "Config"
    assert {"Config", "ConfigError", "dump_config", "load_config"} <= set(dir(configs)) | set(configs.__all__)


def test_an_env_host_keeps_each_slots_episode_apart():
    host = EnvHost("babyai", {"levels": ["GoToRedBall"]}, 3)
    alone = EnvHost("babyai", {"levels": ["GoToRedBall"]})
    tasks = host.tasks("train")[:3]
    for slot, task in enumerate(tasks):
        host.reset(task, slot)
    # slot 1 steps; slots 0 and 2 keep their own states, as a host of one instance each would
    stepped = host.step("Action: turn left", 1)
    alone.reset(tasks[1])
    assert stepped == alone.step("Action: turn left")
    for slot in (0, 2):
        alone.reset(tasks[slot])
        assert host.step("Action: move forward", slot) == alone.step("Action: move forward")
    fresh = EnvHost("babyai", {"levels": ["GoToRedBall"]}, 2)
    fresh.reset(tasks[0], 0)
    with pytest.raises(EnvRestarted):  # a slot never reset holds no episode, whatever the others hold
        fresh.step("Action: turn left", 1)

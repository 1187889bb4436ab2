"""An env actor's process imports what Ray and its env need, and the few project modules that host the env: never
torch, transformers, the whole config schema, structlog or rich (each env actor is its own process, hundreds per
run)."""

import json
import subprocess
import sys

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

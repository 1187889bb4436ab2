"""The CLI and a user's script run from a project that has its own ``configs/`` and ``envs/`` packages: the
script's directory comes first on ``sys.path``, and nothing of agentgym-rl may resolve to those folders."""

import subprocess
import sys
from pathlib import Path

CLI = Path(sys.executable).parent / "agentgym-rl"
SCRIPT = """
from agentgym_rl.configs import load_config
from agentgym_rl.envs import make

config = load_config(None, ["env.options.levels=[GoToRedBall]"])
env = make(config.env.name, config.env.options)
observation = env.reset(env.tasks("train")[0])
print("task:", observation.text.splitlines()[0])
import configs, envs
print("own:", configs.OWN, envs.OWN)
"""


def user_project(root: Path) -> Path:
    for name in ("configs", "envs"):
        (root / name).mkdir()
        (root / name / "__init__.py").write_text(f'OWN = "{name} of the user"\n')
    (root / "script.py").write_text(SCRIPT)
    return root


def test_a_users_configs_and_envs_folders_shadow_nothing(tmp_path: Path):
    project = user_project(tmp_path)
    script = subprocess.run(
        [sys.executable, "script.py"], cwd=project, capture_output=True, text=True, timeout=300, check=False
    )
    assert script.returncode == 0, script.stderr[-3000:]
    assert "task:" in script.stdout
    assert "own: configs of the user envs of the user" in script.stdout
    command = [str(CLI)] if CLI.exists() else [sys.executable, "-m", "agentgym_rl.driver.cli"]
    listing = subprocess.run([*command, "envs"], cwd=project, capture_output=True, text=True, timeout=300, check=False)
    assert listing.returncode == 0, listing.stderr[-3000:]
    assert "babyai" in listing.stdout and "textcraft" in listing.stdout

"""docs/results/gateway/run.sh checks that the agent can run in its Python before it starts anything."""

from __future__ import annotations

import os
import subprocess
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize(
    ("experiment", "agent"),
    [("babyai", "docs/examples/gateway_agent.py"), ("babyai_tools", "docs/examples/agents_sdk_agent.py")],
)
def test_an_agent_python_without_the_agents_packages_is_refused_naming_what_is_missing(
    tmp_path: Path, experiment: str, agent: str
):
    venv.create(tmp_path / "bare", with_pip=False)  # a Python with none of the agent's packages
    bare = tmp_path / "bare" / "bin" / "python"

    done = subprocess.run(
        ["docs/results/gateway/run.sh", experiment, str(tmp_path / "runs")],
        cwd=REPO,
        env={**os.environ, "AGENT_PYTHON": str(bare)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith(f"run.sh: {bare} cannot run {agent} (ModuleNotFoundError: No module named "), (
        done.stderr
    )
    assert done.stderr.rstrip().endswith("run ./install.sh --dev or set AGENT_PYTHON")
    assert done.stdout == "" and not (tmp_path / "runs").exists(), "nothing started"

"""Every script under docs/examples/ runs as a user runs it, and each is shown by a page of the site.

Each script asserts what it shows; here it must exit 0. The custom algorithm's example also runs with
SmolLM2, where target-word's rewards vary within a group, so its advantage and gradient are non-zero.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "docs" / "examples").glob("*.py"))


def run(script: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
    command = [sys.executable, str(script), *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800, check=False)


def test_every_example_is_shown_by_a_page():
    pages = "\n".join(p.read_text() for p in (REPO / "docs").rglob("*.md"))
    assert len(EXAMPLES) >= 4
    for script in EXAMPLES:
        assert f'--8<-- "docs/examples/{script.name}"' in pages, f"no page includes {script.name}"


@pytest.mark.slow  # each a minute or more of the real CLI: the examples run in the slow tier's rotation
@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.stem)
def test_example_runs_and_its_checks_hold(script: Path, tmp_path: Path):
    result = run(script, cwd=tmp_path)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]


@pytest.mark.slow
def test_custom_algorithm_learns_from_smollm2_episodes(tmp_path: Path):
    script = REPO / "docs" / "examples" / "custom_algorithm.py"
    result = run(script, "--model", "smollm2-135m-instruct", "--run-dir", str(tmp_path), cwd=tmp_path)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    [record] = [json.loads(line) for line in (tmp_path / "best-of-group" / "metrics.jsonl").read_text().splitlines()]
    assert 0 < record["mean_reward"] < 1, "the rewards should vary for the example to show anything"
    assert record["rollout/episodes"] == 64
    assert record["learner/advantage_abs_mean"] > 0
    assert record["learner/grad_norm"] > 0 and record["learner/optimizer_steps"] >= 1

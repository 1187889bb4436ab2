"""The README's plug-in example run as a user would: its code saved as `my_algos.py`, its command run.

One iteration of the README's command (SmolLM2 on target-word, where episodes of a task differ)
must give the user's algorithm something to learn from: a non-zero advantage and gradient.
"""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
BIN = Path(sys.executable).parent


def readme_block(marker: str, language: str) -> str:
    return re.search(rf"<!-- {marker} -->\n```{language}\n(.*?)```", README.read_text(), re.DOTALL).group(1)


@pytest.mark.slow
def test_readme_plugin_example_trains_with_a_nonzero_advantage_and_gradient(tmp_path: Path):
    (tmp_path / "my_algos.py").write_text(readme_block("user-algorithm", "python"))
    words = shlex.split(readme_block("user-algorithm-run", "bash").replace("\\\n", " "))
    assignments = dict(word.split("=", 1) for word in words if re.fullmatch(r"[A-Z_]+=.*", word))
    command = [word for word in words if word not in {f"{k}={v}" for k, v in assignments.items()}]
    assert command[0] == "agentgym-rl" and assignments == {"PYTHONPATH": "."}
    # One iteration, in this test's directory: later --set items win.
    command = [str(BIN / command[0]), *command[1:], "--set", "trainer.iterations=1", "--set", "logging.progress=false"]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | assignments
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "runs" / "best-of-group"
    [record] = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert 0 < record["mean_reward"] < 1, "the rewards should vary for the example to show anything"
    assert record["rollout/episodes"] == 64
    assert record["learner/advantage_abs_mean"] > 0
    assert record["learner/grad_norm"] > 0 and record["learner/optimizer_steps"] >= 1

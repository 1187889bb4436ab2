"""Comparisons and settings shared by the end-to-end tests."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def same_episodes(a: Path, b: Path, logprobs_within: float = 1e-4) -> None:
    """Same sampled ids, masks and rewards; log-probabilities equal up to batching round-off (``logprobs_within``)."""
    for line_a, line_b in zip(a.read_text().splitlines(), b.read_text().splitlines(), strict=True):
        ep_a, ep_b = json.loads(line_a), json.loads(line_b)
        for key in ("task_id", "token_ids", "loss_mask", "step_rewards", "weights_version", "truncated"):
            assert ep_a[key] == ep_b[key], key
        assert ep_a["logprobs"] == pytest.approx(ep_b["logprobs"], abs=logprobs_within)


def cli_env() -> dict[str, str]:
    """The environment of a CLI subprocess: this one's, without RAY_ADDRESS (the command starts its own Ray)."""
    return {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """The installed ``agentgym-rl`` (or ``python -m agentgym_rl.driver.cli``) with ``args``, in its own Ray."""
    cli = Path(sys.executable).parent / "agentgym-rl"
    command = [str(cli)] if cli.exists() else [sys.executable, "-m", "agentgym_rl.driver.cli"]
    return subprocess.run(
        [*command, *args], cwd=cwd, env=cli_env(), capture_output=True, text=True, timeout=600, check=False
    )

"""A first run as a new user starts it: ``agentgym-rl train`` with the quickstart config (on tiny-random), on a
machine where no built-in model is built yet, prints the project's own lines and none of the third-party
notices, and its metrics carry the held-out success at the configured iterations."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.helpers import run_cli

REPO = Path(__file__).resolve().parents[2]

# What a first run printed before (issue 48), each from a third-party library.
THIRD_PARTY_LINES = (
    "Converting and de-quantizing GGUF tensors",  # transformers' GGUF loader (building smollm2-135m-instruct)
    "Setting accelerator to CPU",  # DeepSpeed, imported by save_pretrained (building a built-in model)
    "Token authentication is enabled",  # Ray's start of a local instance
    "Generated new authentication token",  # Ray, on a machine's first local instance
    "Sampling rejected:",  # minigrid's BabyAI level generator, printed by the env actors
    # transformers 5.2x (README's install gets it; the dev install's vLLM pins an older one): the decode step's
    # cache argument, and peft reading a deprecated property of a LoRA policy
    "`past_key_values` is deprecated",
    "`past_key_values`/`cache_params` are deprecated",
    "`is_gradient_checkpointing` is deprecated",
)

FIRST_RUN = [
    "--set",
    "model.name=tiny-random",
    "--set",
    "model.adapter=null",  # the quickstart's adapter belongs to smollm2-135m-instruct
    "--set",
    "trainer.iterations=2",
    "--set",
    "trainer.tasks_per_iteration=2",
    "--set",
    "algorithm.group_size=2",
    "--set",
    "sampler.envs_per_sampler=2",
    "--set",
    "sampler.sampling.max_new_tokens=8",
    "--set",
    "curriculum.horizons=[2, 3]",
    "--set",
    "trainer.heldout_tasks=2",
    "--set",
    "trainer.heldout_every=1",
    # 16 test seeds: the two held-out tasks are seed 0 and seed 8 of GoToRedBallGrey, whose level generator
    # rejects a layout before it finds one (it printed "Sampling rejected: ..." from the env actor)
    "--set",
    "env.options.test_seeds=16",
]


@pytest.mark.slow
@pytest.mark.ci
def test_a_first_run_prints_no_third_party_notices_and_records_held_out_success(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # As on a new machine: tiny-random is built (its save_pretrained imports DeepSpeed), and Ray writes its first
    # authentication token (~/.ray/auth_token).
    monkeypatch.setenv("AGENTGYM_RL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    done = run_cli("train", *FIRST_RUN, "--set", f"run.dir={tmp_path / 'runs'}", "--set", "run.name=first", cwd=REPO)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    for line in THIRD_PARTY_LINES:
        assert line not in output, f"{line!r} in the output of train:\n{output}"
    records = [json.loads(line) for line in (tmp_path / "runs" / "first" / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in records] == [0, 1]
    for record in records:
        assert record["heldout/episodes"] == 2.0
        assert 0.0 <= record["heldout/success_low"] <= record["heldout/success_rate"]
        assert record["heldout/success_rate"] <= record["heldout/success_high"] <= 1.0
    assert "held-out tasks played" in output
    assert (tmp_path / "home" / ".ray" / "auth_token").is_file()


@pytest.mark.slow
def test_the_first_build_of_the_built_in_model_says_so_in_one_line_without_the_gguf_bar(tmp_path: Path):
    # The de-quantisation of smollm2-135m-instruct runs once per machine (here: per cache), in the driver.
    env = {**os.environ, "AGENTGYM_RL_CACHE": str(tmp_path / "cache")}
    build = "from agentgym_rl.actors.model_store import model_dir; model_dir('smollm2-135m-instruct')"
    done = subprocess.run(
        [sys.executable, "-c", build], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "building the built-in model from its GGUF file" in output
    for line in THIRD_PARTY_LINES:
        assert line not in output, f"{line!r} in the output of the build:\n{output}"
    assert (tmp_path / "cache" / "models" / "smollm2-135m-instruct-r1" / "config.json").is_file()

"""``docs/results/run_stage.sh`` refuses a stage whose config samples with a simulated engine, before training."""

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_a_stage_with_the_modelled_engine_is_refused_before_it_trains(tmp_path: Path):
    # A tree like the repository's, with one experiment: run_stage.sh runs from it and calls .venv's Python.
    experiment = tmp_path / "configs" / "sim"
    experiment.mkdir(parents=True)
    (experiment / "experiment.yaml").write_text(
        "base_model: tiny-random\neval: {env: babyai, config: configs/sim/grpo.yaml, episodes: 2}\n"
    )
    (experiment / "grpo.yaml").write_text(
        "run: {name: sim-grpo}\nmodel: {name: tiny-random, adapter: null}\nsampler: {engine: modelled}\n"
    )
    (tmp_path / ".venv").symlink_to(sys.prefix)
    done = subprocess.run(
        ["bash", str(REPO / "docs" / "results" / "run_stage.sh"), "sim", "grpo"],
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert "run_stage.sh (configs/sim/grpo.yaml) refuses engine 'modelled': it is a simulation" in done.stderr
    assert (
        not (tmp_path / "runs").exists()
        and not (tmp_path / "docs" / "results" / "sim" / "grpo" / "stage.json").exists()
    )

"""`agentgym-rl plot`: training curves from run directories' metrics.jsonl."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from actors.plot import PlotError, parse_run_arguments, plot_runs, read_curve
from actors.rundir import RunDir


def make_run(path: Path, successes: list[float], horizons: list[int]) -> Path:
    run = RunDir(path)
    path.mkdir(parents=True)
    for iteration, (success, horizon) in enumerate(zip(successes, horizons, strict=True)):
        run.append_metrics({"iteration": iteration, "success_rate": success, "horizon": horizon})
    return path


def test_curve_is_smoothed_with_a_trailing_mean(tmp_path: Path):
    run = make_run(tmp_path / "a", [0.0, 1.0, 0.5, 0.5], [3, 3, 6, 6])
    curve = read_curve(run, smooth=2)
    assert curve["iteration"] == [0, 1, 2, 3]
    assert curve["success_rate"] == [0.0, 0.5, 0.75, 0.5]
    assert curve["horizon"] == [3, 3, 6, 6]


def test_plot_writes_a_rendered_png_with_one_line_per_run(tmp_path: Path):
    a = make_run(tmp_path / "stepwise", [0.1, 0.4, 0.6, 0.8], [3, 3, 6, 6])
    b = make_run(tmp_path / "fixed", [0.2, 0.2, 0.3, 0.3], [10, 10, 10, 10])
    output = plot_runs(parse_run_arguments([str(a), f"long={b}"]), tmp_path / "out" / "curves.png", title="t")
    image = imread(output)
    assert image.shape[0] > 300 and image.shape[1] > 500
    colours = np.unique(image.reshape(-1, image.shape[-1])[:, :3], axis=0)
    assert len(colours) > 20  # axes, text and two coloured lines, not a blank canvas


def test_bad_runs_are_named(tmp_path: Path):
    with pytest.raises(PlotError, match="no metrics.jsonl"):
        read_curve(tmp_path, smooth=1)
    (tmp_path / "metrics.jsonl").write_text('{"iteration": 0, "success_rate": 1.0, "horizon": 3}\nnot json\n')
    with pytest.raises(PlotError, match="metrics.jsonl:2"):
        read_curve(tmp_path, smooth=1)
    with pytest.raises(PlotError, match="twice"):
        parse_run_arguments([f"x={tmp_path}", f"x={tmp_path}"])


def test_cli_reports_a_missing_run_and_exits_2(tmp_path: Path):
    result = subprocess.run(
        [sys.executable, "-m", "actors.cli", "plot", str(tmp_path / "nope"), "--output", str(tmp_path / "p.png")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "no metrics.jsonl" in result.stderr
    assert not (tmp_path / "p.png").exists()

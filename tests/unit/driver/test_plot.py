"""`agentgym-rl plot`: training curves from run directories' metrics.jsonl."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from agentgym_rl.actors.rundir import RunDir
from agentgym_rl.driver.plot import PlotError, parse_run_arguments, plot_runs, read_curves, read_records


def make_run(path: Path, successes: list[float], horizons: list[int]) -> Path:
    run = RunDir(path)
    path.mkdir(parents=True)
    for iteration, (success, horizon) in enumerate(zip(successes, horizons, strict=True)):
        run.append_metrics({"iteration": iteration, "success_rate": success, "horizon": horizon})
    return path


def test_curve_is_smoothed_with_a_trailing_mean(tmp_path: Path):
    run = make_run(tmp_path / "a", [0.0, 1.0, 0.5, 0.5], [3, 3, 6, 6])
    curve = read_curves("a", run, smooth=2)["a"]
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


def test_a_mixed_run_has_a_curve_per_env_from_its_own_keys(tmp_path: Path):
    run = RunDir(tmp_path / "mix")
    (tmp_path / "mix").mkdir()
    run.append_metrics(
        {
            "iteration": 1,
            "success_rate": 0.5,
            "horizon": 8,
            "env/babyai/success_rate": 0.75,
            "env/babyai/horizon": 3,
            "env/textcraft/success_rate": 0.25,
            "env/textcraft/horizon": 8,
        }
    )
    run.append_metrics(
        {
            "iteration": 0,
            "success_rate": 0.0,
            "horizon": 8,
            "env/textcraft/success_rate": 0.0,
            "env/textcraft/horizon": 8,
        }
    )
    curves = read_curves("m", tmp_path / "mix", smooth=1)
    assert list(curves) == ["m", "m/textcraft", "m/babyai"]
    assert curves["m"] == {"iteration": [0, 1], "success_rate": [0.0, 0.5], "horizon": [8, 8]}
    assert curves["m/babyai"] == {"iteration": [1], "success_rate": [0.75], "horizon": [3]}
    assert curves["m/textcraft"]["success_rate"] == [0.0, 0.25]
    single = make_run(tmp_path / "one", [0.1, 0.2], [3, 3])
    assert list(read_curves("one", single, smooth=1)) == ["one"]
    plot_runs({"m": tmp_path / "mix", "one": single}, tmp_path / "mix.png")
    assert imread(tmp_path / "mix.png").shape[0] > 300


def test_bad_runs_are_named(tmp_path: Path):
    with pytest.raises(PlotError, match="no metrics.jsonl"):
        read_records(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"iteration": 0, "success_rate": 1.0, "horizon": 3}\nnot json\n')
    with pytest.raises(PlotError, match="metrics.jsonl:2"):
        read_records(tmp_path)
    with pytest.raises(PlotError, match="twice"):
        parse_run_arguments([f"x={tmp_path}", f"x={tmp_path}"])


def test_cli_reports_a_missing_run_and_exits_2(tmp_path: Path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentgym_rl.driver.cli",
            "plot",
            str(tmp_path / "nope"),
            "--output",
            str(tmp_path / "p.png"),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "no metrics.jsonl" in result.stderr
    assert not (tmp_path / "p.png").exists()

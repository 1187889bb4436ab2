"""``agentgym-rl plot``: training curves (success rate and horizon per iteration) of runs as a PNG."""

from __future__ import annotations

import json
from pathlib import Path

from actors.rundir import METRICS_FILE


class PlotError(ValueError):
    """A run that cannot be plotted; the message names the file and the problem."""


def read_curve(run_dir: Path, smooth: int) -> dict[str, list[float]]:
    """Iteration, success rate (a trailing mean over ``smooth`` iterations) and horizon of one run."""
    path = run_dir / METRICS_FILE
    if not path.is_file():
        raise PlotError(f"{run_dir}: no {METRICS_FILE}; give run directories made by `agentgym-rl train`")
    records = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            record = json.loads(line)
            records.append((int(record["iteration"]), float(record["success_rate"]), int(record["horizon"])))
        except (ValueError, KeyError, TypeError) as exc:
            raise PlotError(f"{path}:{number}: not a metrics record ({exc})") from None
    if not records:
        raise PlotError(f"{path} is empty: the run has not finished an iteration yet")
    records.sort()
    success = [s for _, s, _ in records]
    window = max(smooth, 1)
    smoothed = [
        sum(success[max(0, i - window + 1) : i + 1]) / len(success[max(0, i - window + 1) : i + 1])
        for i in range(len(success))
    ]
    return {
        "iteration": [float(i) for i, _, _ in records],
        "success_rate": smoothed,
        "horizon": [float(h) for _, _, h in records],
    }


def plot_runs(runs: dict[str, Path], output: Path, *, smooth: int = 1, title: str | None = None) -> Path:
    """Draw success rate (top) and horizon (bottom) per iteration for each labelled run into ``output``."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers
    import matplotlib.pyplot as plt

    curves = {label: read_curve(path, smooth) for label, path in runs.items()}
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True, height_ratios=[2, 1])
    for label, curve in curves.items():
        top.plot(curve["iteration"], curve["success_rate"], label=label)
        bottom.step(curve["iteration"], curve["horizon"], where="post", label=label)
    top.set_ylabel("success rate" + (f" (mean of {smooth})" if smooth > 1 else ""))
    top.set_ylim(-0.02, 1.02)
    top.grid(alpha=0.3)
    top.legend(loc="lower right")
    bottom.set_ylabel("horizon (turns)")
    bottom.set_xlabel("iteration")
    bottom.grid(alpha=0.3)
    if title:
        top.set_title(title)
    figure.tight_layout()
    output.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(output, dpi=120)
    plt.close(figure)
    return output


def parse_run_arguments(values: list[str]) -> dict[str, Path]:
    """``LABEL=RUN_DIR`` or ``RUN_DIR`` (labelled by its folder name) -> {label: path}."""
    runs: dict[str, Path] = {}
    for value in values:
        label, _, path = value.partition("=") if "=" in value else (Path(value).name, "", value)
        if not label or not path:
            raise PlotError(f"{value!r}: give RUN_DIR or LABEL=RUN_DIR")
        if label in runs:
            raise PlotError(f"label {label!r} is given twice; name runs with LABEL=RUN_DIR")
        runs[label] = Path(path)
    return runs

"""``agentgym-rl plot``: training curves (success rate and horizon per iteration) of runs as a PNG."""

from __future__ import annotations

import json
from pathlib import Path

from agentgym_rl.actors.rundir import METRICS_FILE
from agentgym_rl.configs.errors import AgentGymError


class PlotError(AgentGymError, ValueError):
    """A run that cannot be plotted; the message names the file and the problem."""


def read_records(run_dir: Path) -> list[dict]:
    """The metrics records of one run, in iteration order.

    Raises:
        PlotError: naming the file (and line) when there is no metrics file, a line is not a metrics
            record, or there is no record yet.
    """
    path = run_dir / METRICS_FILE
    if not path.is_file():
        raise PlotError(f"{run_dir}: no {METRICS_FILE}; give run directories made by `agentgym-rl train`")
    records = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            record = json.loads(line)
            float(record["success_rate"]), int(record["horizon"])  # every record must carry the overall keys
            records.append((int(record["iteration"]), record))
        except (ValueError, KeyError, TypeError) as exc:
            raise PlotError(f"{path}:{number}: not a metrics record ({exc})") from None
    if not records:
        raise PlotError(f"{path} is empty: the run has not finished an iteration yet")
    return [record for _, record in sorted(records, key=lambda pair: pair[0])]


def env_names(records: list[dict]) -> list[str]:
    """The envs of a multi-env run (those with ``env/<name>/success_rate`` keys), in first-seen order."""
    names: dict[str, None] = {}
    for record in records:
        for key in record:
            if key.startswith("env/") and key.endswith("/success_rate"):
                names[key[len("env/") : -len("/success_rate")]] = None
    return list(names)


def curve(records: list[dict], smooth: int, prefix: str = "") -> dict[str, list[float]]:
    """Iteration, success rate (a trailing mean over ``smooth`` iterations) and horizon under the keys
    ``<prefix>success_rate`` and ``<prefix>horizon``; iterations without them are left out."""
    points = [
        (int(r["iteration"]), float(r[f"{prefix}success_rate"]), int(r[f"{prefix}horizon"]))
        for r in records
        if f"{prefix}success_rate" in r and f"{prefix}horizon" in r
    ]
    success = [s for _, s, _ in points]
    window = max(smooth, 1)
    smoothed = [
        sum(success[max(0, i - window + 1) : i + 1]) / len(success[max(0, i - window + 1) : i + 1])
        for i in range(len(success))
    ]
    return {
        "iteration": [float(i) for i, _, _ in points],
        "success_rate": smoothed,
        "horizon": [float(h) for _, _, h in points],
    }


def read_curves(label: str, run_dir: Path, smooth: int) -> dict[str, dict[str, list[float]]]:
    """The curves of one run by legend label: ``label`` for the overall keys and, for a multi-env run,
    ``label/<env>`` for each env's own success rate and horizon."""
    records = read_records(run_dir)
    curves = {label: curve(records, smooth)}
    for name in env_names(records):
        curves[f"{label}/{name}"] = curve(records, smooth, prefix=f"env/{name}/")
    return curves


def plot_runs(runs: dict[str, Path], output: Path, *, smooth: int = 1, title: str | None = None) -> Path:
    """Draw success rate (top) and horizon (bottom) per iteration for each labelled run into ``output``; a
    multi-env run adds a dashed pair of lines per env."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers
    import matplotlib.pyplot as plt

    curves = {}
    for label, path in runs.items():
        curves.update(read_curves(label, path, smooth))
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True, height_ratios=[2, 1])
    for label, points in curves.items():
        style = "--" if label not in runs else "-"
        top.plot(points["iteration"], points["success_rate"], style, label=label)
        bottom.step(points["iteration"], points["horizon"], style, where="post", label=label)
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

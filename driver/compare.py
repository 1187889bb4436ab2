"""``agentgym-rl compare``: a paired comparison of two ``agentgym-rl eval`` reports of one env split, or a table of
several reports each compared with the first.

Two policies evaluated with the same eval seed play every episode (task, sample) from the same
sampling seed, so their outcomes pair up episode by episode. The paired difference in success rate
is far tighter than two independent intervals suggest when the policies agree on most tasks, and the
exact McNemar test reads only the episodes on which they disagree.

Everything but ``load_report`` is pure (no Ray, no I/O).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from pydantic import ValidationError

from agentgym_rl.configs.engines import SimulatedEngineError, refuse_simulated
from agentgym_rl.configs.errors import AgentGymError
from agentgym_rl.driver.evaluate import Z_95, EpisodeResult, mean_interval, wilson_interval

# Settings that change what an episode is; two reports must agree on them to be paired.
PAIRED_SETTINGS = ("env", "split", "max_turns", "temperature")
REPORT_KEYS = ("name", "policy", *PAIRED_SETTINGS, "results")


class CompareError(AgentGymError, ValueError):
    """Two reports that cannot be compared; the message names the report, what differs and what to do."""


# ----------------------------------------------------------------------------- pure statistics


def mcnemar_exact_p(only_b: int, only_a: int) -> float:
    """Exact two-sided McNemar p: a binomial test of the discordant pairs with p = 1/2.

    p = min(1, 2 P(X <= min(b, c))) for X ~ Binomial(b + c, 1/2), where b = ``only_b`` and c = ``only_a``
    are the pairs only one policy solved; 1 when there are none.
    """
    if only_b < 0 or only_a < 0:
        raise ValueError(f"mcnemar_exact_p needs counts >= 0, got {only_b} and {only_a}")
    n = only_b + only_a
    if n == 0:
        return 1.0
    # Exact integers until the one division (Python divides big ints with correct rounding).
    tail = sum(math.comb(n, k) for k in range(min(only_b, only_a) + 1))
    return min(1.0, 2 * tail / 2**n)


def paired_difference_interval(
    both: int, only_b: int, only_a: int, neither: int, z: float = Z_95
) -> tuple[float, float]:
    """Interval of the paired difference in success rate, rate B - rate A = (b - c) / n.

    Newcombe's hybrid score interval for paired data, "method 10" of R. G. Newcombe (1998),
    "Improved confidence intervals for the difference between binomial proportions based on paired
    data", Statistics in Medicine 17, 2635-2650. With the pair table a = ``both``, b = ``only_b``,
    c = ``only_a``, d = ``neither``, rates p1 = (a + b) / n (B) and p2 = (a + c) / n (A) with Wilson
    intervals (l1, u1) and (l2, u2), and phi = (ad - bc) / sqrt((a+b)(c+d)(a+c)(b+d)) (0 when a
    margin is empty):

        lower = p1 - p2 - sqrt((p1 - l1)^2 - 2 phi (p1 - l1)(u2 - p2) + (u2 - p2)^2)
        upper = p1 - p2 + sqrt((u1 - p1)^2 - 2 phi (u1 - p1)(p2 - l2) + (p2 - l2)^2)

    95 % for the default ``z``; the limits stay within [-1, 1].
    """
    a, b, c, d = both, only_b, only_a, neither
    if min(a, b, c, d) < 0 or a + b + c + d < 1:
        raise ValueError(f"paired_difference_interval needs counts >= 0 and at least one pair, got {a, b, c, d}")
    n = a + b + c + d
    p1, p2 = (a + b) / n, (a + c) / n
    l1, u1 = wilson_interval(a + b, n, z)
    l2, u2 = wilson_interval(a + c, n, z)
    margins = (a + b) * (c + d) * (a + c) * (b + d)
    phi = (a * d - b * c) / math.sqrt(margins) if margins else 0.0
    # max(0, .): with phi = 1 and equal arms the radicand is 0 and rounding may take it just below.
    lower = math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    upper = math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    return p1 - p2 - lower, p1 - p2 + upper


# ----------------------------------------------------------------------------- pairing


def _label(report: dict, which: str) -> str:
    return f"{which} ({report['name']})"


def _episodes(report: dict, which: str) -> dict[tuple[int, int], EpisodeResult]:
    """The report's episode records by (task_id, sample)."""
    records = report["results"]
    if not records:
        raise CompareError(f"{_label(report, which)} has no episodes; re-run `agentgym-rl eval`")
    if any("seed" not in record for record in records):
        raise CompareError(
            f"{_label(report, which)} has episodes without a seed (a report made before eval recorded them); "
            "re-run `agentgym-rl eval` for it, with the same --seed as the other report"
        )
    episodes: dict[tuple[int, int], EpisodeResult] = {}
    for index, record in enumerate(records):
        try:
            episode = EpisodeResult.model_validate(record)
        except ValidationError as exc:
            raise CompareError(f"{_label(report, which)}: results[{index}] is not an episode record ({exc})") from None
        key = (episode.task_id, episode.sample)
        if key in episodes:
            raise CompareError(f"{_label(report, which)} holds task {key[0]} sample {key[1]} twice")
        episodes[key] = episode
    return episodes


def _some(keys: set[tuple[int, int]], limit: int = 5) -> str:
    shown = ", ".join(f"task {task} sample {sample}" for task, sample in sorted(keys)[:limit])
    return shown + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def pair_episodes(report_a: dict, report_b: dict) -> list[tuple[EpisodeResult, EpisodeResult]]:
    """The two reports' episodes paired by (task_id, sample, seed), in (task_id, sample) order.

    Raises:
        CompareError: the reports differ in env, split, turn limit or temperature, in their set of
            (task_id, sample) episodes, or in an episode's seed; or a report lacks seeds.
    """
    for key in PAIRED_SETTINGS:
        if report_a[key] != report_b[key]:
            raise CompareError(
                f"the reports differ in {key}: A {report_a[key]!r}, B {report_b[key]!r}; compare evaluations of "
                f"the same {', '.join(PAIRED_SETTINGS)}"
            )
    a, b = _episodes(report_a, "A"), _episodes(report_b, "B")
    if a.keys() != b.keys():
        only_a, only_b = set(a) - set(b), set(b) - set(a)
        parts = [
            f"{len(keys)} only in {which}: {_some(keys)}" for which, keys in (("A", only_a), ("B", only_b)) if keys
        ]
        raise CompareError(
            f"the reports played different episodes ({'; '.join(parts)}); re-run `agentgym-rl eval` with the same "
            "--episodes and --samples for both"
        )
    reseeded = {key for key in a if a[key].seed != b[key].seed}
    if reseeded:
        raise CompareError(
            f"{len(reseeded)} of {len(a)} episodes have different seeds in A and B ({_some(reseeded)}; eval --seed "
            f"A {report_a.get('seed')!r}, B {report_b.get('seed')!r}); re-run `agentgym-rl eval` with the same --seed"
        )
    return [(a[key], b[key]) for key in sorted(a)]


def compare_reports(report_a: dict, report_b: dict) -> dict:
    """The paired comparison B - A of two eval reports.

    Pairs are treated as independent; with more than one sample per task they are not, so the
    interval and p are optimistic then (as ``summarize``'s intervals are).

    Returns:
        ``a`` and ``b`` (name, policy, episodes, success rate with its Wilson interval, mean score), the
        shared settings, the pair table (``both``, ``only_b``, ``only_a``, ``neither``), the success rate
        difference with Newcombe's paired interval, the exact McNemar p and the mean score difference
        with its Student-t interval (None for one pair).

    Raises:
        CompareError: from ``pair_episodes``.
    """
    pairs = pair_episodes(report_a, report_b)
    n = len(pairs)
    both = sum(a.success and b.success for a, b in pairs)
    only_b = sum(b.success and not a.success for a, b in pairs)
    only_a = sum(a.success and not b.success for a, b in pairs)
    neither = n - both - only_b - only_a
    score_diffs = [b.score - a.score for a, b in pairs]

    def side(report: dict, successes: int, scores: list[float]) -> dict:
        return {
            "name": report["name"],
            "policy": report["policy"],
            "episodes": n,
            "success_rate": successes / n,
            "success_rate_ci95": wilson_interval(successes, n),
            "mean_score": sum(scores) / n,
        }

    return {
        "a": side(report_a, both + only_a, [a.score for a, _ in pairs]),
        "b": side(report_b, both + only_b, [b.score for _, b in pairs]),
        **{key: report_a[key] for key in PAIRED_SETTINGS},
        "tasks": len({a.task_id for a, _ in pairs}),
        "episodes": n,
        "both": both,
        "only_b": only_b,
        "only_a": only_a,
        "neither": neither,
        "success_rate_diff": (only_b - only_a) / n,
        "success_rate_diff_ci95": paired_difference_interval(both, only_b, only_a, neither),
        "mcnemar_p": mcnemar_exact_p(only_b, only_a),
        "mean_score_diff": sum(score_diffs) / n,
        "mean_score_diff_ci95": mean_interval(score_diffs),
    }


def format_comparison(comparison: dict) -> str:
    """``comparison`` (from ``compare_reports``) as the lines the command prints."""
    settings = (
        f"{comparison['split']}, at most {comparison['max_turns']} turns, temperature {comparison['temperature']}"
    )
    lines = [
        f"{comparison['env']} ({settings}): {comparison['episodes']} paired episodes of {comparison['tasks']} tasks"
    ]
    for which in ("a", "b"):
        side = comparison[which]
        low, high = side["success_rate_ci95"]
        lines.append(
            f"{which.upper()}: {side['name']} ({side['policy']}): {side['episodes']} episodes, success "
            f"{side['success_rate']:.3f} [{low:.3f}, {high:.3f}], mean score {side['mean_score']:.3f}"
        )
    low, high = comparison["success_rate_diff_ci95"]
    lines.append(
        f"success B - A: {comparison['success_rate_diff']:+.3f} [{low:+.3f}, {high:+.3f}] "
        "(95 %, Newcombe paired score interval)"
    )
    lines.append(
        f"discordant: {comparison['only_b']} solved only by B, {comparison['only_a']} only by A; "
        f"exact McNemar p = {comparison['mcnemar_p']:.4g}"
    )
    score = f"mean score B - A: {comparison['mean_score_diff']:+.3f}"
    ci = comparison["mean_score_diff_ci95"]
    lines.append(score + (f" [{ci[0]:+.3f}, {ci[1]:+.3f}] (95 %, paired t)" if ci is not None else ""))
    return "\n".join(lines)


def holm_adjusted(ps: list[float]) -> list[float]:
    """Holm's step-down adjustment of the p values ``ps`` (returned in their order): the k-th smallest is
    multiplied by the number of hypotheses not yet rejected (m - k + 1), kept at least the one before it and at
    most 1. Rejecting where the adjusted p < alpha holds the family-wise error rate of all the comparisons
    together at alpha (Holm, 1979, Scand. J. Statist. 6: 65-70)."""
    adjusted = [0.0] * len(ps)
    running = 0.0
    for rank, index in enumerate(sorted(range(len(ps)), key=lambda i: ps[i])):
        running = max(running, min(1.0, (len(ps) - rank) * ps[index]))
        adjusted[index] = running
    return adjusted


def compare_table(baseline: tuple[str, dict], rows: list[tuple[str, dict]]) -> dict:
    """Every report of ``rows`` compared with ``baseline``; each is a (label, report) pair.

    Returns:
        ``baseline`` (its label) and ``rows``: per row, its label, ``compare_reports(baseline, row)`` and
        ``mcnemar_p_holm``, its McNemar p adjusted by Holm over the rows.

    Raises:
        CompareError: a row that cannot be paired with the baseline, named by its label.
    """
    comparisons = []
    for label, report in rows:
        try:
            comparisons.append(compare_reports(baseline[1], report))
        except CompareError as exc:
            raise CompareError(f"{label} against {baseline[0]}: {exc}") from None
    holm = holm_adjusted([c["mcnemar_p"] for c in comparisons])
    return {
        "baseline": baseline[0],
        "rows": [
            {"label": label, **c, "mcnemar_p_holm": p} for (label, _), c, p in zip(rows, comparisons, holm, strict=True)
        ],
    }


def format_compare_table(table: dict) -> str:
    """``table`` (from ``compare_table``) as a Markdown table, a line of settings above it."""
    first = table["rows"][0]
    base = table["baseline"]
    settings = f"{first['split']}, at most {first['max_turns']} turns, temperature {first['temperature']}"
    paired = f"{first['episodes']} paired episodes of {first['tasks']} tasks"
    lines = [
        f"{first['env']} ({settings}): {paired}; each row against {base}",
        "",
        f"| policy | success [95 % CI] | vs {base} [95 % CI] | only it / only {base} | exact McNemar p | Holm p |",
        "|---|---|---|---|---|---|",
    ]
    low, high = first["a"]["success_rate_ci95"]
    lines.append(f"| {base} | {first['a']['success_rate']:.3f} [{low:.3f}, {high:.3f}] | | | | |")
    for row in table["rows"]:
        low, high = row["b"]["success_rate_ci95"]
        d_low, d_high = row["success_rate_diff_ci95"]
        lines.append(
            f"| {row['label']} | {row['b']['success_rate']:.3f} [{low:.3f}, {high:.3f}] "
            f"| {row['success_rate_diff']:+.3f} [{d_low:+.3f}, {d_high:+.3f}] | {row['only_b']} / {row['only_a']} "
            f"| {row['mcnemar_p']:.2g} | {row['mcnemar_p_holm']:.2g} |"
        )
    return "\n".join(lines)


# ----------------------------------------------------------------------------- files


def labelled_reports(values: list[str]) -> list[tuple[str, dict]]:
    """``LABEL=REPORT`` or ``REPORT`` -> [(label, report)], in order. A ``REPORT`` is labelled by the report's own
    name; reports that share a name (every report of an adapter is named after the adapter) are labelled by
    their paths instead (``path_labels``), so ``compare sft/eval.json gateway/eval.json`` works as written.

    Raises:
        CompareError: an empty label or path, a label given twice (or one file given twice), or a file that is
            not an eval report.
    """
    given: list[tuple[str | None, Path, dict]] = []
    for value in values:
        label, _, path = value.partition("=") if "=" in value else (None, "", value)
        if label == "" or not path:
            raise CompareError(f"{value!r}: give REPORT or LABEL=REPORT")
        given.append((label, Path(path), load_report(Path(path))))
    by_name: dict[str, list[int]] = {}
    for index, (label, _, report) in enumerate(given):
        if label is None:
            by_name.setdefault(report["name"], []).append(index)
    labels = [label if label is not None else report["name"] for label, _, report in given]
    for indices in by_name.values():
        if len(indices) > 1:
            for index, label in zip(indices, path_labels([given[i][1] for i in indices]), strict=True):
                labels[index] = label
    reports: list[tuple[str, dict]] = []
    for label, (_, _, report) in zip(labels, given, strict=True):
        if label in (seen for seen, _ in reports):
            raise CompareError(f"two reports are labelled {label!r}; name them with LABEL=REPORT")
        reports.append((label, report))
    return reports


def path_labels(paths: list[Path]) -> list[str]:
    """Each path's shortest ending (in whole path components, of its absolute form) that no other path of
    ``paths`` ends with; the whole absolute path for a file given twice.

    Example: ``path_labels([Path("results/sft/eval.json"), Path("results/gateway/eval.json")]) ==
    ["sft/eval.json", "gateway/eval.json"]``.
    """
    parts = [path.absolute().parts for path in paths]
    labels = []
    for index, mine in enumerate(parts):
        others = [theirs for other, theirs in enumerate(parts) if other != index]
        depth = next(
            (n for n in range(1, len(mine) + 1) if all(theirs[-n:] != mine[-n:] for theirs in others)), len(mine)
        )
        labels.append(Path(*mine[-depth:]).as_posix())
    return labels


def load_report(path: Path) -> dict:
    """An ``agentgym-rl eval`` report from its JSON file.

    Raises:
        CompareError: naming the file when it is missing, not JSON, not an eval report, or a report of a simulated
            engine (``modelled``, which no comparison may use).
    """
    try:
        report = json.loads(path.read_text())
    except OSError as exc:
        raise CompareError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    except json.JSONDecodeError as exc:
        raise CompareError(f"{path}: not JSON ({exc}); give reports written by `agentgym-rl eval`") from None
    missing = [key for key in REPORT_KEYS if key not in report] if isinstance(report, dict) else list(REPORT_KEYS)
    if missing:
        raise CompareError(
            f"{path}: not an eval report (no {', '.join(missing)}); give reports written by `agentgym-rl eval`"
        )
    try:
        refuse_simulated(str(report.get("engine", "")), "agentgym-rl compare")
    except SimulatedEngineError as exc:
        raise CompareError(f"{path}: {exc}") from None
    return report

"""The results pages and README quote the committed evaluation reports, number for number.

A table row names its report by a link to it (``[SFT](babyai/sft/eval.json)``). Every number such a row quotes is
checked against that report, against what ``agentgym-rl compare``'s own functions compute from it and a baseline
report, or against the ``stage.json`` beside it; rows without a link (experiments whose reports were lost) are not
read. Every ``eval.json`` under docs/results/ must have a row on a results page, so a new stage cannot be left off.
What a cell holds is read from its column's header:

- ``success ...``: ``rate [Wilson interval]``, and where quoted ``truncated N %`` and rates by category
  (``GoToObjS6 0.78``);
- ``by WORD (A / B / ...)``: the success of categories ``WORD A``, ``WORD B``, ... (a rate, or a count of tasks
  where the page prints no decimal point);
- ``p vs SFT ...``: ``p (only B / only A)`` and where quoted ``difference [interval]`` of the row (B) against the SFT
  stage of the row's own experiment, else of the page's (A); a cell saying "against it" compares the other way;
- ``vs X [95 % CI]``, ``only it / only X``, ``exact McNemar p``, ``Holm p``: ``agentgym-rl compare``'s table of each
  row against the table's first;
- a column whose header holds ``time``: ``training D`` (stage.json's ``training.seconds`` where recorded, else the
  stage's ``wall_seconds``, else ``train_seconds``), ``D in the N iterations`` (``iteration_seconds_sum``) and
  ``evaluation D`` (``eval_seconds``); in an ``evaluation time`` column the cell's leading D;
- ``machine``: the stage's CPU (``2-core Intel Xeon``; ``family 26`` where quoted).

A quoted number is right when it lies within half a unit of its last printed digit of the report's value.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from agentgym_rl.driver.compare import compare_reports, compare_table, load_report

REPO = Path(__file__).resolve().parents[3]
RESULTS = REPO / "docs" / "results"
README = REPO / "README.md"
PAGES = [README, *sorted(RESULTS.glob("*.md"))]

NUMBER = r"[+-]?\d+(?:\.\d+)?(?:e[+-]?\d+)?"
RATE_CI = re.compile(rf"({NUMBER}) \[({NUMBER}), ({NUMBER})\]")
SIGNED_CI = re.compile(rf"([+-]{NUMBER}) \[({NUMBER}), ({NUMBER})\]")
P_COUNTS = re.compile(rf"({NUMBER}) \((\d+) / (\d+)\)")
DURATION = r"\d{1,3}(?:,\d{3})* s|\d+ h \d+ min|\d+ h|\d+(?:\.\d+)? min"
LINK = re.compile(r"\]\(([^)\s]+)\)")
NOT_MEASURED = "not measured yet"
# README's results table: its env column's names and the folders under docs/results/ that hold their stages.
ENV_FOLDERS = {"BabyAI": "babyai", "TextCraft": "textcraft", "Deep Search": "search"}


@dataclass
class Row:
    line: int
    cells: list[str]  # markup (bold) removed, links kept
    report: Path | None  # the one report the row links, or None


@dataclass
class Table:
    header: list[str]
    rows: list[Row]


def split_cells(line: str) -> list[str]:
    return [cell.strip().replace("**", "") for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def tables(page: Path, text: str) -> tuple[list[Table], list[str]]:
    """The page's Markdown tables (outside code blocks), and a problem for each row that links something under
    docs/results/ that is not one existing report or links two reports."""
    found: list[Table] = []
    problems: list[str] = []
    fenced = False
    previous_was_row = False
    for number, line in enumerate(text.splitlines(), start=1):
        if line.startswith("```"):
            fenced = not fenced
        is_row = not fenced and line.startswith("|")
        if is_row and not previous_was_row:
            found.append(Table(header=[cell.lower() for cell in split_cells(line)], rows=[]))
        elif is_row and not re.fullmatch(r"\|(?:\s*:?-+:?\s*\|)+", line.strip()):
            cells = split_cells(line)
            targets = {(page.parent / target).resolve() for target in LINK.findall(line)}
            reports = {path for path in targets if path.suffix == ".json" and path.is_relative_to(RESULTS)}
            if len(reports) > 1:
                problems.append(f"{page.name}:{number}: the row links {len(reports)} reports; link one")
            missing = [path for path in reports if not path.is_file()]
            if missing:
                problems.append(f"{page.name}:{number}: the row links {missing[0]}, which does not exist")
            report = next(iter(reports)) if len(reports) == 1 and not missing else None
            found[-1].rows.append(Row(line=number, cells=cells, report=report))
        previous_was_row = is_row
    return found, problems


def agrees(text: str, value: float) -> bool:
    """Whether ``text``, a number as the page prints it, is ``value`` to its printed precision."""
    mantissa, _, exponent = text.lower().partition("e")
    unit = 10.0 ** (int(exponent or 0) - len(mantissa.partition(".")[2]))
    return abs(float(text) - value) <= unit / 2 * (1 + 1e-9)


def seconds(duration: str) -> tuple[float, float]:
    """A printed duration (``1,089 s``, ``18 min``, ``2 h 48 min``) in seconds, with the unit it was printed to."""
    if duration.endswith(" s"):
        return float(duration[:-2].replace(",", "")), 1.0
    hours = re.match(r"(\d+) h", duration)
    minutes = re.search(r"(\d+(?:\.\d+)?) min", duration)
    total = 3600 * float(hours.group(1) if hours else 0) + 60 * float(minutes.group(1) if minutes else 0)
    return total, 60.0 if minutes else 3600.0


def duration_agrees(duration: str, value: float) -> bool:
    quoted, unit = seconds(duration)
    return abs(quoted - value) <= unit / 2


def sft_baseline(report: Path, page: Path) -> Path | None:
    """The SFT stage a ``p vs SFT`` column compares a row with: its own experiment's, else its page's."""
    for experiment in (report.parent.parent, RESULTS / page.stem):
        candidate = experiment / "sft" / "eval.json"
        if candidate.is_file():
            return candidate
    return None


def check_success(cell: str, report: dict) -> list[str]:
    overall = report["overall"]
    match = RATE_CI.search(cell)
    if match is None:
        return [f"no 'rate [low, high]' in {cell!r}"]
    rate, low, high = match.groups()
    problems = [
        f"{name} {text}, the report {value:.4f}"
        for name, text, value in (
            ("success", rate, overall["success_rate"]),
            ("interval low", low, overall["success_rate_ci95"][0]),
            ("interval high", high, overall["success_rate_ci95"][1]),
        )
        if not agrees(text, value)
    ]
    truncated = re.search(rf"truncated ({NUMBER}) %", cell)
    if truncated and not agrees(truncated.group(1), 100 * overall["truncated_rate"]):
        problems.append(f"truncated {truncated.group(1)} %, the report {100 * overall['truncated_rate']:.1f} %")
    for name, text in re.findall(rf"(\w+) ({NUMBER})\b", cell):
        if name in report["categories"] and not agrees(text, report["categories"][name]["success_rate"]):
            problems.append(f"{name} {text}, the report {report['categories'][name]['success_rate']:.3f}")
    return problems


def check_categories(header: str, cell: str, report: dict) -> list[str]:
    word, names = re.fullmatch(r"by (\w+) \((.+)\)", header).groups()
    values = cell.split(" / ")
    problems = []
    for name, text in zip(names.split(" / "), values, strict=True):
        # "by depth (1 / 2)" names the categories "depth 1", "depth 2"; "by hops (2 / 3)" names "2 hops", "3 hops"
        category = report["categories"].get(f"{word} {name}") or report["categories"].get(f"{name} {word}")
        if category is None:
            problems.append(f"the report has no category '{word} {name}' or '{name} {word}'")
            continue
        value = category["success_rate"] * (1 if "." in text else category["episodes"])
        if not agrees(text, value):
            problems.append(f"{name} {text}, the report {value:.3f}")
    return problems


def check_p_vs_sft(cell: str, report_path: Path, page: Path) -> list[str]:
    baseline = sft_baseline(report_path, page)
    if baseline is None:
        return [f"p vs SFT {cell!r}, but no SFT stage for {report_path.relative_to(RESULTS)}"]
    if baseline == report_path:
        return [f"the SFT row quotes {cell!r} against itself"]
    match = P_COUNTS.search(cell)
    if match is None:
        return [f"no 'p (only it / only SFT)' in {cell!r}"]
    sft, row = load_report(baseline), load_report(report_path)
    comparison = compare_reports(row, sft) if "against it" in cell else compare_reports(sft, row)
    p, only_b, only_a = match.groups()
    problems = []
    if not agrees(p, comparison["mcnemar_p"]):
        problems.append(f"p {p}, compare {comparison['mcnemar_p']:.3g}")
    if (int(only_b), int(only_a)) != (comparison["only_b"], comparison["only_a"]):
        problems.append(f"({only_b} / {only_a}), compare ({comparison['only_b']} / {comparison['only_a']})")
    difference = SIGNED_CI.search(cell)
    if difference:
        quoted = difference.groups()
        computed = (comparison["success_rate_diff"], *comparison["success_rate_diff_ci95"])
        if not all(agrees(text, value) for text, value in zip(quoted, computed, strict=True)):
            problems.append(
                f"difference {difference.group(0)}, compare {computed[0]:+.3f} [{computed[1]:+.3f}, {computed[2]:+.3f}]"
            )
    return problems


def stage_times(folder: Path) -> dict[str, float]:
    stage = json.loads((folder / "stage.json").read_text())
    wall = folder / "wall_seconds"
    if "training" in stage:
        training = stage["training"]["seconds"]
    elif wall.is_file():
        training = float(wall.read_text())
    else:
        training = stage["train_seconds"]
    return {
        "training": training,
        "iterations": stage["iteration_seconds_sum"],
        "iteration count": stage["iterations"],
        "evaluation": stage["eval_seconds"],
    }


def check_times(header: str, cell: str, folder: Path) -> list[str]:
    if not (folder / "stage.json").is_file():
        return [f"{header} {cell!r}, but {folder.relative_to(RESULTS)} has no stage.json"]
    times = stage_times(folder)
    quoted: list[tuple[str, str]] = []  # (what, duration)
    both = rf"({DURATION})(?: \(({DURATION})\))?"
    if header == "evaluation time":
        leading = re.match(both, cell)
        quoted += [("evaluation", duration) for duration in leading.groups() if duration] if leading else []
    for what in ("training", "evaluation"):
        for match in re.finditer(rf"\b{what} {both}", cell):
            quoted += [(what, duration) for duration in match.groups() if duration]
    problems = []
    for match in re.finditer(rf"({DURATION}) (?:of it )?in the (\d+) iterations|iterations alone ({DURATION})", cell):
        duration, count, alone = match.groups()
        quoted.append(("iterations", duration or alone))
        if count is not None and int(count) != times["iteration count"]:
            problems.append(f"{count} iterations, stage.json {times['iteration count']}")
    if not quoted:
        return [f"no duration read in {header} {cell!r}"]
    problems += [
        f"{what} {duration}, stage.json {times[what]:,.0f} s"
        for what, duration in quoted
        if not duration_agrees(duration, times[what])
    ]
    return problems


def check_machine(cell: str, folder: Path) -> list[str]:
    if not (folder / "stage.json").is_file():
        return [f"machine {cell!r}, but {folder.relative_to(RESULTS)} has no stage.json"]
    machine = json.loads((folder / "stage.json").read_text())["machine"]
    cpu = " ".join(re.sub(r"\((?:R|TM)\)| Processor| CPU", "", machine["cpu"]).split())
    problems = [] if f"{machine['cores']}-core {cpu}" in cell else [f"{cell!r}, stage.json {machine}"]
    family = re.search(r"family[ -](\d+)", cell)
    if family and family.group(1) != str(machine["cpu_family"]):
        problems.append(f"family {family.group(1)}, stage.json {machine['cpu_family']}")
    return problems


def check_compare_table(table: Table) -> list[str]:
    """A table as ``agentgym-rl compare`` prints it: each linked row against the first."""
    column = {name: i for i, name in enumerate(table.header)}
    vs = next(i for i, name in enumerate(table.header) if name.startswith("vs "))
    only = next((i for i, name in enumerate(table.header) if name.startswith("only it /")), None)
    first, *rest = [row for row in table.rows if row.report is not None]
    problems = [f"{first.line}: the first row, the baseline, quotes {first.cells[vs]!r}"] if first.cells[vs] else []
    result = compare_table(
        ("first", load_report(first.report)), [(str(row.line), load_report(row.report)) for row in rest]
    )
    for row, computed in zip(rest, result["rows"], strict=True):
        expected = (computed["success_rate_diff"], *computed["success_rate_diff_ci95"])
        difference = SIGNED_CI.fullmatch(row.cells[vs])
        if difference is None or not all(
            agrees(text, value) for text, value in zip(difference.groups(), expected, strict=True)
        ):
            problems.append(f"{row.line}: difference {row.cells[vs]!r}, compare {expected}")
        counts = (computed["only_b"], computed["only_a"])
        if only is not None and row.cells[only] != f"{counts[0]} / {counts[1]}":
            problems.append(f"{row.line}: {row.cells[only]!r}, compare {counts[0]} / {counts[1]}")
        for name, key in (("exact mcnemar p", "mcnemar_p"), ("holm p", "mcnemar_p_holm")):
            if name in column and not agrees(row.cells[column[name]], computed[key]):
                problems.append(f"{row.line}: {name} {row.cells[column[name]]}, compare {computed[key]:.3g}")
    return problems


def page_problems(page: Path, text: str) -> list[str]:
    """Every number a linked row of ``text`` (the page ``page``) quotes that its report does not hold."""
    found, problems = tables(page, text)
    for table in found:
        if not any(row.report for row in table.rows):
            continue
        if not any(name.startswith("success") for name in table.header):
            problems.append(f"{page.name}: a table of linked rows without a success column: {table.header}")
        if any(name.startswith("vs ") for name in table.header):
            problems += [f"{page.name}:{problem}" for problem in check_compare_table(table)]
        for row in table.rows:
            if row.report is None:
                continue
            report = load_report(row.report)
            for header, cell in zip(table.header, row.cells, strict=True):
                if header.startswith("success"):
                    found_problems = check_success(cell, report)
                elif header.startswith("by "):
                    found_problems = check_categories(header, cell, report)
                elif header.startswith("p vs sft") and cell:
                    found_problems = check_p_vs_sft(cell, row.report, page)
                elif "time" in header:
                    found_problems = check_times(header, cell, row.report.parent)
                elif header == "machine":
                    found_problems = check_machine(cell, row.report.parent)
                else:
                    found_problems = []
                problems += [f"{page.name}:{row.line}: {problem}" for problem in found_problems]
    return problems


def linked_reports(page: Path) -> set[Path]:
    found, _ = tables(page, page.read_text())
    return {row.report for table in found for row in table.rows if row.report is not None}


QUOTING_PAGES = [page for page in PAGES if linked_reports(page)]


def test_every_eval_report_has_a_row_on_a_results_page():
    reports = {path.resolve() for path in RESULTS.rglob("eval.json") if "part" not in path.relative_to(RESULTS).parts}
    quoted = set().union(*(linked_reports(page) for page in PAGES if page != README))
    assert len(reports) >= 8
    missing = sorted(str(path.relative_to(RESULTS)) for path in reports - quoted)
    assert not missing, f"eval reports with no linked table row on docs/results/*.md: {missing}"
    # README's table covers every env's measured base and SFT rows at least.
    assert {RESULTS / "babyai" / "sft" / "eval.json", RESULTS / "babyai" / "base" / "eval.json"} <= linked_reports(
        README
    )


@pytest.mark.parametrize("page", QUOTING_PAGES, ids=lambda page: page.name)
def test_linked_rows_quote_their_reports(page: Path):
    problems = page_problems(page, page.read_text())
    assert not problems, "\n".join(problems)


def test_the_quoting_pages_include_readme_and_each_staged_experiment():
    assert {README, RESULTS / "babyai.md", RESULTS / "textcraft.md"} <= set(QUOTING_PAGES)


def readme_results_table() -> Table:
    found, _ = tables(README, README.read_text())
    [table] = [table for table in found if table.header[:2] == ["env", "row"]]
    return table


def test_readme_says_not_measured_yet_only_where_no_report_exists():
    table = readme_results_table()
    assert {row.cells[0] for row in table.rows} == set(ENV_FOLDERS)
    for row in table.rows:
        if not any(NOT_MEASURED in cell for cell in row.cells):
            assert row.report is not None, f"README:{row.line} quotes no report and does not say '{NOT_MEASURED}'"
            continue
        label = re.sub(r"\[|\]\([^)]*\)", "", row.cells[1]).lower()
        folder = RESULTS / ENV_FOLDERS[row.cells[0]]
        stages = {path.parent.name for path in folder.glob("*/eval.json")}
        measured = stages & {label} if label in ("base", "sft") else stages - {"base", "sft"}
        assert not measured, f"README:{row.line} says '{NOT_MEASURED}' but {folder.name}/{measured} has a report"


def prose(page: Path) -> str:
    return " ".join(page.read_text().split())


def test_reports_quoted_only_in_prose():
    """The two reports babyai.md quotes outside a table: the third experiment's SFT policy and the GiGPO adapter
    evaluated again on vLLM's CPU build (against the stage's own evaluation)."""
    page = prose(RESULTS / "babyai.md")
    third = load_report(RESULTS / "babyai3" / "sft.json")
    overall, levels = third["overall"], third["categories"]
    low, high = overall["success_rate_ci95"]
    by_level = ", ".join(
        f"{name} {levels[name]['success_rate']:.2f}"
        for name in sorted(levels, key=lambda name: -levels[name]["success_rate"])
    )
    assert (
        f"**{overall['success_rate']:.3f} [{low:.3f}, {high:.3f}]** (truncated {100 * overall['truncated_rate']:.0f} "
        f"%; {by_level})" in page
    )
    vllm = compare_reports(
        load_report(RESULTS / "babyai" / "gigpo_stepwise" / "eval.json"),
        load_report(RESULTS / "babyai" / "gigpo_stepwise" / "eval_vllm.json"),
    )
    (low, high), (d_low, d_high) = vllm["b"]["success_rate_ci95"], vllm["success_rate_diff_ci95"]
    assert (
        f"gave {vllm['b']['success_rate']:.3f} [{low:.3f}, {high:.3f}] against the stage's "
        f"{vllm['a']['success_rate']:.3f}: {vllm['success_rate_diff']:+.3f} [{d_low:+.3f}, {d_high:+.3f}], "
        f"{vllm['only_b']} / {vllm['only_a']} discordant, exact McNemar p = {vllm['mcnemar_p']:.2f}" in page
    )


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("**0.385 [0.320, 0.454]**", "**0.385 [0.320, 0.455]**"),  # an interval's limit
        ("**2.4e-07** (45 / 8)", "**2.4e-07** (45 / 9)"),  # a discordant count
        ("**1.9e-05** (46 / 13)", "**1.8e-05** (46 / 13)"),  # a p value
        ("+0.165 [+0.092, +0.234]", "+0.165 [+0.092, +0.243]"),  # a paired interval
        ("evaluation 1,481 s", "evaluation 1,418 s"),  # a wall time
        ("GoToRedBallGrey 0.34", "GoToRedBallGrey 0.43"),  # a level's rate
        ("| 22 / 9 | 0.029 | 0.059 |", "| 22 / 9 | 0.029 | 0.058 |"),  # a Holm p in the compare table
    ],
)
def test_a_number_changed_by_hand_is_caught(old: str, new: str):
    page = RESULTS / "babyai.md"
    text = page.read_text()
    assert text.count(old) == 1
    problems = page_problems(page, text.replace(old, new))
    assert len(problems) == 1, problems


def test_a_row_linking_a_missing_or_second_report_is_refused():
    page = RESULTS / "textcraft.md"
    text = page.read_text()
    row = "[base SmolLM2-135M-Instruct](textcraft/base/eval.json)"
    assert row in text
    _, problems = tables(page, text.replace(row, "[base](textcraft/none/eval.json)"))
    assert problems and "does not exist" in problems[0]
    _, problems = tables(page, text.replace(row, row + " [SFT](babyai/sft/eval.json)"))
    assert problems and "links 2 reports" in problems[0]

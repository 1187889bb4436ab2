"""Paired comparison of eval reports: exact McNemar p, Newcombe's paired interval, Holm's adjustment, refusals,
the real CLI."""

import json
from pathlib import Path

import pytest

from agentgym_rl.driver.cli import main
from agentgym_rl.driver.compare import (
    CompareError,
    compare_reports,
    holm_adjusted,
    load_report,
    mcnemar_exact_p,
    pair_episodes,
    paired_difference_interval,
    path_labels,
)
from agentgym_rl.driver.evaluate import episode_seeds, wilson_interval


def report(outcomes: list[tuple[bool, float]], name: str = "a", samples: int = 1, **settings) -> dict:
    """An eval report as ``agentgym-rl eval`` writes it: ``outcomes`` by task, then sample, with eval seed 0."""
    results = []
    for index, (success, score) in enumerate(outcomes):
        task_id, sample = divmod(index, samples)
        results.append(
            {
                "task_id": task_id,
                "sample": sample,
                "seed": episode_seeds(0, task_id, samples)[sample],
                "category": "all",
                "success": success,
                "score": score,
                "turns": 3,
                "truncated": False,
                "failed": False,
            }
        )
    base = {"env": "babyai", "split": "test", "max_turns": 20, "temperature": 1.0, "seed": 0, "samples": samples}
    return {"name": name, "policy": f"runs/{name}/policy", **base, **settings, "results": results}


def pairs(both: int, only_b: int, only_a: int, neither: int) -> tuple[dict, dict]:
    """Reports A and B whose pair table is (both, only B, only A, neither), scores equal to successes."""
    table = [(True, True)] * both + [(False, True)] * only_b + [(True, False)] * only_a + [(False, False)] * neither
    a = report([(sa, float(sa)) for sa, _ in table], name="a")
    b = report([(sb, float(sb)) for _, sb in table], name="b")
    return a, b


def write(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data))
    return path


# ----------------------------------------------------------------------------- statistics


def test_mcnemar_exact_p_is_the_two_sided_binomial_tail():
    # X ~ Binomial(10, 1/2): P(X <= 1) = (C(10,0) + C(10,1)) / 2^10 = 11/1024, doubled
    assert mcnemar_exact_p(9, 1) == 2 * (1 + 10) / 1024 == 0.021484375
    assert mcnemar_exact_p(1, 9) == 0.021484375
    assert mcnemar_exact_p(0, 0) == 1.0  # all concordant
    assert mcnemar_exact_p(3, 3) == 1.0  # 2 P(X <= 3) for Binomial(6, 1/2) = 2 * 42/64 > 1, capped
    assert mcnemar_exact_p(5, 0) == 2 / 32
    with pytest.raises(ValueError, match=">= 0"):
        mcnemar_exact_p(-1, 2)


def test_paired_interval_by_hand():
    # n = 10 pairs: a = 5 both, b = 3 only B, c = 0 only A, d = 2 neither; B 8/10, A 5/10, difference 0.3.
    # phi = (ad - bc) / sqrt((a+b)(c+d)(a+c)(b+d)) = (10 - 0) / sqrt(8 * 2 * 5 * 5) = 10 / 20 = 0.5.
    # Wilson 8/10 = (0.490162, 0.943318); Wilson 5/10 = 0.5 -+ 1.959964/1.384146 * sqrt(0.025 + 0.009604)
    #   = 0.5 -+ 0.263407 = (0.236593, 0.763407).
    # lower = 0.3 - sqrt(0.309838^2 - 2 * 0.5 * 0.309838 * 0.263407 + 0.263407^2)
    #       = 0.3 - sqrt(0.095999 - 0.081613 + 0.069383) = 0.3 - sqrt(0.083769) = 0.3 - 0.289429 = 0.010571
    # upper = 0.3 + sqrt(0.143318^2 - 2 * 0.5 * 0.143318 * 0.263407 + 0.263407^2)
    #       = 0.3 + sqrt(0.020540 - 0.037751 + 0.069383) = 0.3 + sqrt(0.052172) = 0.3 + 0.228412 = 0.528412
    low, high = paired_difference_interval(5, 3, 0, 2)
    assert low == pytest.approx(0.010571, abs=1e-5)
    assert high == pytest.approx(0.528412, abs=1e-5)
    assert wilson_interval(5, 10) == pytest.approx((0.236593, 0.763407), abs=1e-6)


def test_paired_interval_matches_newcombes_published_example():
    # Newcombe (1998), Table II example (a): 36, 12, 2, 0 of 50 pairs; method 10 gives 0.0569 to 0.3404.
    low, high = paired_difference_interval(36, 12, 2, 0)
    assert (round(low, 4), round(high, 4)) == (0.0569, 0.3404)


def test_paired_interval_limits_and_symmetry():
    assert paired_difference_interval(0, 10, 0, 0)[1] == pytest.approx(1.0)  # B solves all, A none
    assert paired_difference_interval(0, 0, 10, 0)[0] == pytest.approx(-1.0)
    # identical outcomes, phi = 1: the half-widths are |(p - l) - (u - p)|, 0 where Wilson is symmetric (p = 1/2)
    low, high = paired_difference_interval(5, 0, 0, 5)
    assert low == pytest.approx(0.0, abs=1e-9) and high == pytest.approx(0.0, abs=1e-9)
    # swapping A and B mirrors the interval
    forward, backward = paired_difference_interval(7, 5, 2, 6), paired_difference_interval(7, 2, 5, 6)
    assert forward == pytest.approx((-backward[1], -backward[0]))
    with pytest.raises(ValueError, match="at least one pair"):
        paired_difference_interval(0, 0, 0, 0)


# ----------------------------------------------------------------------------- comparing reports


def test_compare_counts_discordant_pairs_and_scores():
    a, b = pairs(both=3, only_b=9, only_a=1, neither=7)
    comparison = compare_reports(a, b)
    assert (comparison["both"], comparison["only_b"], comparison["only_a"], comparison["neither"]) == (3, 9, 1, 7)
    assert comparison["episodes"] == comparison["tasks"] == 20
    assert comparison["mcnemar_p"] == 0.021484375
    assert comparison["success_rate_diff"] == pytest.approx(8 / 20)
    assert comparison["success_rate_diff_ci95"] == pytest.approx(paired_difference_interval(3, 9, 1, 7))
    assert comparison["a"]["success_rate"] == pytest.approx(4 / 20)
    assert comparison["b"]["success_rate_ci95"] == pytest.approx(wilson_interval(12, 20))
    assert comparison["mean_score_diff"] == pytest.approx(8 / 20)
    assert comparison["a"]["name"] == "a" and comparison["b"]["policy"] == "runs/b/policy"


def test_all_concordant_reports_give_p_one():
    a, b = pairs(both=4, only_b=0, only_a=0, neither=6)
    comparison = compare_reports(a, b)
    assert comparison["mcnemar_p"] == 1.0 and comparison["success_rate_diff"] == 0.0


def test_several_samples_pair_per_task_and_sample():
    a = report([(True, 1.0), (False, 0.0), (False, 0.0), (False, 0.0)], samples=2)
    b = report([(True, 1.0), (True, 1.0), (False, 0.0), (True, 1.0)], name="b", samples=2)
    # the records arrive in any order; pairing goes by (task, sample, seed)
    b["results"].reverse()
    comparison = compare_reports(a, b)
    assert comparison["tasks"] == 2 and comparison["episodes"] == 4
    assert (comparison["both"], comparison["only_b"], comparison["only_a"]) == (1, 2, 0)
    paired = pair_episodes(a, b)
    assert [(x.task_id, x.sample) for x, _ in paired] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(x.seed == y.seed for x, y in paired)


def test_refuses_different_episodes():
    a = report([(True, 1.0)] * 4)
    b = report([(True, 1.0)] * 5, name="b")
    with pytest.raises(CompareError, match=r"different episodes \(1 only in B: task 4 sample 0\)"):
        compare_reports(a, b)


def test_refuses_different_seeds():
    a, b = pairs(both=2, only_b=1, only_a=0, neither=1)
    b["results"][2]["seed"] += 1
    with pytest.raises(CompareError, match=r"1 of 4 episodes have different seeds.*task 2 sample 0.*same --seed"):
        compare_reports(a, b)


def test_refuses_reports_without_seeds():
    a, b = pairs(both=2, only_b=1, only_a=0, neither=1)
    for record in a["results"]:
        del record["seed"]
    with pytest.raises(CompareError, match=r"A \(a\) has episodes without a seed.*re-run `agentgym-rl eval`"):
        compare_reports(a, b)


@pytest.mark.parametrize(
    ("key", "value"), [("env", "textcraft"), ("split", "train"), ("max_turns", 30), ("temperature", 0.7)]
)
def test_refuses_different_settings(key, value):
    a, b = pairs(both=2, only_b=1, only_a=0, neither=1)
    b[key] = value
    with pytest.raises(CompareError, match=f"differ in {key}: A {a[key]!r}, B {value!r}"):
        compare_reports(a, b)


def test_load_report_names_the_file(tmp_path: Path):
    with pytest.raises(CompareError, match="cannot read it"):
        load_report(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(CompareError, match="bad.json: not JSON"):
        load_report(tmp_path / "bad.json")
    with pytest.raises(CompareError, match="other.json: not an eval report \\(no name, policy"):
        load_report(write(tmp_path / "other.json", {"env": "babyai"}))


def test_a_report_of_the_modelled_engine_is_refused(tmp_path: Path):
    a, _ = pairs(both=1, only_b=0, only_a=0, neither=1)
    assert load_report(write(tmp_path / "real.json", {**a, "engine": "transformers"}))["engine"] == "transformers"
    with pytest.raises(
        CompareError, match="sim.json: agentgym-rl compare refuses engine 'modelled': it is a simulation"
    ):
        load_report(write(tmp_path / "sim.json", {**a, "engine": "modelled"}))


def test_holm_adjustment_by_hand():
    # sorted: 0.005 x 4 = 0.02; 0.01 x 3 = 0.03; 0.03 x 2 = 0.06; 0.04 x 1 = 0.04, kept at 0.06 (monotone)
    assert holm_adjusted([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm_adjusted([0.6, 0.7]) == [1.0, 1.0]  # capped at 1
    assert holm_adjusted([0.02]) == [0.02] and holm_adjusted([]) == []


# ----------------------------------------------------------------------------- the command


def test_cli_compare_prints_the_comparison_and_writes_json(tmp_path: Path, capsys):
    a, b = pairs(both=3, only_b=9, only_a=1, neither=7)
    files = [str(write(tmp_path / "A.json", a)), str(write(tmp_path / "B.json", b))]
    output = tmp_path / "out" / "comparison.json"
    assert main(["compare", *files, "--output", str(output)]) == 0
    printed = capsys.readouterr().out
    assert "exact McNemar p = 0.02148" in printed
    assert "discordant: 9 solved only by B, 1 only by A" in printed
    assert "success B - A: +0.400" in printed
    saved = json.loads(output.read_text())
    assert saved["mcnemar_p"] == 0.021484375 and saved["only_b"] == 9


def test_cli_compare_refuses_with_exit_2(tmp_path: Path, capsys):
    a, b = pairs(both=2, only_b=1, only_a=0, neither=1)
    b["env"] = "textcraft"
    files = [str(write(tmp_path / "A.json", a)), str(write(tmp_path / "B.json", b))]
    assert main(["compare", *files]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("agentgym-rl: error: the reports differ in env")


def test_cli_compare_tables_several_reports_against_the_first(tmp_path: Path, capsys):
    # per task: (A, B, C) successes; B against A: 9 only B, 1 only A; C against A: 1 and 1
    table = [(True, True, True)] * 3 + [(False, True, False)] * 9 + [(True, False, True)] * 1
    table += [(False, False, True)] * 1 + [(True, True, False)] * 1 + [(False, False, False)] * 5
    files = []
    for which, name in enumerate(["a", "b", "c"]):
        outcomes = [(row[which], float(row[which])) for row in table]
        files.append(str(write(tmp_path / f"{name}.json", report(outcomes, name="babyai-test-adapter"))))
    output = tmp_path / "table.json"
    argv = ["compare", f"SFT={files[0]}", f"GRPO={files[1]}", f"other={files[2]}", "--output", str(output)]
    assert main(argv) == 0
    printed = capsys.readouterr().out.splitlines()
    assert "20 paired episodes of 20 tasks; each row against SFT" in printed[0]
    # Holm over the two rows: 0.0215 x 2 = 0.043 for GRPO; 1 for the other
    low, high = wilson_interval(13, 20)
    d_low, d_high = paired_difference_interval(4, 9, 1, 6)
    grpo = f"| GRPO | 0.650 [{low:.3f}, {high:.3f}] | +0.400 [{d_low:+.3f}, {d_high:+.3f}] | 9 / 1 | 0.021 | 0.043 |"
    low, high = wilson_interval(5, 20)
    d_low, d_high = paired_difference_interval(4, 1, 1, 14)
    other = f"| other | 0.250 [{low:.3f}, {high:.3f}] | +0.000 [{d_low:+.3f}, {d_high:+.3f}] | 1 / 1 | 1 | 1 |"
    assert grpo in printed and other in printed, printed
    saved = json.loads(output.read_text())
    assert saved["baseline"] == "SFT" and [row["label"] for row in saved["rows"]] == ["GRPO", "other"]
    assert saved["rows"][0]["mcnemar_p_holm"] == pytest.approx(2 * 0.021484375)


@pytest.mark.parametrize(
    ("labels", "named"),
    [(["", "b"], "give REPORT or LABEL=REPORT"), (["x", "x", "y"], "two reports are labelled 'x'"), (["a"], "two")],
)
def test_cli_compare_refuses_bad_labels_and_one_report(tmp_path: Path, capsys, labels, named):
    a, b = pairs(both=2, only_b=1, only_a=0, neither=1)
    paths = [write(tmp_path / f"{i}.json", [a, b][i % 2]) for i in range(len(labels))]
    assert (
        main(["compare", *(f"{label}={path}" if label != "a" else str(path) for label, path in zip(labels, paths))])
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and named in err[0], err


def test_reports_sharing_a_name_are_labelled_by_the_shortest_path_ending_that_tells_them_apart(tmp_path: Path, capsys):
    a, b = pairs(both=3, only_b=9, only_a=1, neither=7)
    (tmp_path / "sft").mkdir()
    (tmp_path / "gateway").mkdir()
    files = [
        str(write(tmp_path / "sft" / "eval.json", {**a, "name": "adapter"})),
        str(write(tmp_path / "gateway" / "eval.json", {**b, "name": "adapter"})),
    ]
    assert main(["compare", *files]) == 0
    printed = capsys.readouterr().out
    assert "A: sft/eval.json (" in printed and "B: gateway/eval.json (" in printed
    assert main(["compare", files[0], files[0]]) == 2  # one file twice: nothing tells them apart
    assert "two reports are labelled" in capsys.readouterr().err


def test_path_labels_take_whole_components_until_no_other_path_ends_alike():
    paths = [Path("/r/a/x.json"), Path("/r/b/x.json"), Path("/r/c/b/x.json")]
    assert path_labels(paths) == ["a/x.json", "r/b/x.json", "c/b/x.json"]
    assert path_labels([Path("/r/one.json"), Path("/r/two.json")]) == ["one.json", "two.json"]

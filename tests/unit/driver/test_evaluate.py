"""Evaluation metrics against hand-computed values, turn limits, checkpoint resolution (task categories and scores
are env hooks: tests/unit/envs/test_env_hooks.py)."""

import itertools
import shutil
from pathlib import Path

import pytest

from agentgym_rl.actors.model_store import model_dir
from agentgym_rl.actors.rundir import RunDir
from agentgym_rl.configs import Config, ConfigError, dump_config, load_config
from agentgym_rl.configs.engines import SimulatedEngineError
from agentgym_rl.driver.evaluate import (
    EpisodeResult,
    EvalError,
    EvalOptions,
    build_config,
    episode_seeds,
    eval_turn_limit,
    mean_interval,
    pass_at_k,
    pick_tasks,
    resolve_checkpoint,
    summarize,
    summarize_by_category,
    wilson_interval,
)
from agentgym_rl.envs import EnvError
from tests.unit.learner.helpers import batch_of
from tests.unit.learner.test_learner import make_learner


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 1, 0.4),  # c / n
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (5, 0, 3, 0.0),
        (3, 2, 2, 1.0),  # every pair holds a success
        (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5)
    ],
)
def test_pass_at_k_hand_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


@pytest.mark.parametrize(("n", "c", "k"), [(4, 1, 2), (6, 2, 3), (5, 3, 4), (7, 0, 2)])
def test_pass_at_k_equals_the_fraction_of_k_subsets_with_a_success(n, c, k):
    outcomes = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(outcomes, k))
    assert pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))


def test_pass_at_k_rejects_impossible_counts():
    with pytest.raises(ValueError, match="n=2 c=3"):
        pass_at_k(2, 3, 1)
    with pytest.raises(ValueError, match="k=3"):
        pass_at_k(2, 1, 3)


def test_wilson_interval_hand_values():
    # 8/10: center (0.8 + 1.96^2/20) / (1 + 1.96^2/10), half 1.96/1.38415 * sqrt(0.016 + 0.009604)
    low, high = wilson_interval(8, 10)
    assert low == pytest.approx(0.4902, abs=1e-4)
    assert high == pytest.approx(0.9433, abs=1e-4)
    low, high = wilson_interval(0, 10)
    assert low == 0.0
    assert high == pytest.approx(0.2775, abs=1e-4)
    assert wilson_interval(10, 10)[1] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="n >= 1"):
        wilson_interval(0, 0)


def test_mean_interval_uses_student_t():
    low, high = mean_interval([1.0, 2.0, 3.0, 4.0])
    # mean 2.5, sd sqrt(5/3), t(0.975, 3) = 3.182446
    half = 3.182446 * (5 / 3) ** 0.5 / 2
    assert (low, high) == (pytest.approx(2.5 - half, abs=1e-5), pytest.approx(2.5 + half, abs=1e-5))
    assert mean_interval([3.0]) is None


def result(task_id: int, sample: int, success: bool, score: float, category: str = "a", truncated: bool = False):
    return EpisodeResult(
        task_id=task_id,
        sample=sample,
        seed=episode_seeds(0, task_id, sample + 1)[sample],
        category=category,
        success=success,
        score=score,
        turns=3,
        truncated=truncated,
    )


def test_summarize_avg_and_pass_at_k_by_hand():
    results = [
        result(0, 0, True, 1.0, "x"),
        result(0, 1, False, 0.0, "x", truncated=True),
        result(1, 0, False, 0.0, "y", truncated=True),
        result(1, 1, False, 0.5, "y"),
        result(2, 0, True, 1.0, "x"),
        result(2, 1, True, 1.0, "x"),
    ]
    overall = summarize(results, 2)
    assert overall["tasks"] == 3 and overall["episodes"] == 6
    assert overall["success_rate"] == pytest.approx(0.5)
    assert overall["avg@2"] == pytest.approx((0.5 + 0.0 + 1.0) / 3)
    assert overall["pass@2"] == pytest.approx((1.0 + 0.0 + 1.0) / 3)
    assert overall["mean_score"] == pytest.approx(3.5 / 6)
    assert overall["truncated_rate"] == pytest.approx(2 / 6)
    assert overall["success_rate_ci95"] == pytest.approx(wilson_interval(3, 6))
    by_category = summarize_by_category(results, 2)
    assert list(by_category) == ["x", "y"]
    assert by_category["x"]["success_rate"] == pytest.approx(0.75)
    assert by_category["x"]["pass@2"] == pytest.approx(1.0)
    assert by_category["y"]["pass@2"] == 0.0
    assert by_category["y"]["mean_score"] == pytest.approx(0.25)


def test_episode_seeds_are_those_earlier_reports_played():
    # Pinned: a report's episodes reproduce, and pair up in compare, only while these stay the same.
    assert episode_seeds(0, 7, 3) == [1369798745, 2153889110, 378758007]
    assert episode_seeds(3, 7, 2) == [2580024465, 2227149223]
    assert episode_seeds(0, 7, 1) == episode_seeds(0, 7, 3)[:1]  # more samples keep the first ones


def test_pick_tasks_spreads_evenly_and_checks_the_count():
    assert pick_tasks(list(range(100, 110)), None) == list(range(100, 110))
    assert pick_tasks(list(range(100, 110)), 5) == [100, 102, 104, 106, 108]
    with pytest.raises(EvalError, match="has 10 tasks"):
        pick_tasks(list(range(10)), 11)


def test_eval_turn_limits_are_the_papers_for_every_env_that_has_one():
    paper = {"babyai": 20, "sciworld": 30, "textcraft": 30, "search": 30, "web": 15, "webarena-remote": 15}
    assert {name: eval_turn_limit(name, None) for name in paper} == paper
    assert eval_turn_limit("web", 7) == 7
    with pytest.raises(EvalError, match="target-word.*--max-turns"):
        eval_turn_limit("target-word", None)
    with pytest.raises(EnvError, match="unknown env 'webarena'"):
        eval_turn_limit("webarena", None)


def make_checkpoint(root: Path, iteration: int) -> Path:
    """A run directory as train leaves it, with the tiny-random model as the checkpoint's policy."""
    run = RunDir(root)
    run.create(Config.model_validate({"env": {"name": "babyai", "options": {"levels": ["GoToRedBall"]}}}))
    checkpoint = run.checkpoint_dir(iteration)
    shutil.copytree(model_dir("tiny-random"), checkpoint / "policy")
    (checkpoint / "trainer.json").write_text("{}")
    return checkpoint


def lora_checkpoint(root: Path) -> Path:
    """A run directory whose checkpoint a LoRA learner on tiny-random wrote (its policy/ is an adapter)."""
    run = RunDir(root)
    run.create(Config.model_validate({"model": {"name": "tiny-random"}, "learner": {"lora": {"enabled": True}}}))
    checkpoint = run.checkpoint_dir(1)
    learner = make_learner("sft", "learner.lora.enabled=true", "learner.lr=1e-2")
    learner.update_batch(batch_of())
    learner.save_checkpoint(str(checkpoint))
    (checkpoint / "trainer.json").write_text("{}")
    return checkpoint


def test_resolve_checkpoint_finds_policy_and_run_dir(tmp_path: Path):
    older = make_checkpoint(tmp_path / "run", 2)
    newer = make_checkpoint(tmp_path / "run", 4)
    folder, policy, run_dir = resolve_checkpoint(str(older))
    assert (folder, policy, run_dir.path) == (older, older / "policy", tmp_path / "run")
    # a run directory means its latest complete checkpoint
    assert resolve_checkpoint(str(tmp_path / "run"))[0] == newer
    # a checkpoint's policy directory is that checkpoint, so its run's config applies
    folder, policy, run_dir = resolve_checkpoint(str(older / "policy"))
    assert (folder, policy, run_dir.path) == (older, older / "policy", tmp_path / "run")
    # a bare model directory is its own policy and belongs to no run
    bare = model_dir("tiny-random")
    assert resolve_checkpoint(str(bare)) == (bare, bare, None)
    with pytest.raises(EvalError, match="neither a policy/ model or adapter nor a model or adapter directory"):
        resolve_checkpoint(str(tmp_path))


def test_a_lora_checkpoint_plays_its_adapter_over_the_recorded_base(tmp_path: Path):
    checkpoint = lora_checkpoint(tmp_path / "run")
    _, policy, run_dir = resolve_checkpoint(str(checkpoint))
    assert policy == checkpoint / "policy"
    config = build_config(EvalOptions(env="babyai"), str(policy), run_dir)
    assert (config.model.name, config.model.adapter) == ("tiny-random", str(policy))
    # the adapter directory alone (as a stage commits it) is a checkpoint of no run
    bare = tmp_path / "adapter"
    shutil.copytree(policy, bare)
    assert resolve_checkpoint(str(bare)) == (bare, bare, None)


def test_build_config_keeps_the_runs_env_options_and_applies_overrides(tmp_path: Path):
    checkpoint = make_checkpoint(tmp_path / "run", 2)
    _, policy, run_dir = resolve_checkpoint(str(checkpoint))
    options = EvalOptions(env="babyai", temperature=0.7, overrides=["sampler.sampling.max_new_tokens=12"])
    config = build_config(options, str(policy), run_dir)
    assert config.model.name == str(policy)
    assert config.env.options == {"levels": ["GoToRedBall"]} and config.env.split == "test"
    assert config.sampler.sampling.temperature == 0.7 and config.sampler.sampling.max_new_tokens == 12
    # another env starts from its own default options
    assert build_config(EvalOptions(env="textcraft"), str(policy), run_dir).env.options == {}
    with pytest.raises(ConfigError, match="sampler.sampling.max_tokens: unknown key"):
        build_config(EvalOptions(env="babyai", overrides=["sampler.sampling.max_tokens=3"]), str(policy), None)


def test_eval_refuses_the_modelled_engine():
    with pytest.raises(SimulatedEngineError, match="agentgym-rl eval refuses engine 'modelled': it is a simulation"):
        build_config(EvalOptions(env="babyai", overrides=["sampler.engine=modelled"]), "tiny-random", None)


def test_a_model_plays_with_the_budgets_of_a_given_config_and_a_run_refuses_one(tmp_path: Path):
    preset = Path(__file__).resolve().parents[3] / "configs" / "quickstart.yaml"
    quickstart = load_config(preset)
    config = build_config(EvalOptions(env="babyai", config=str(preset)), "smollm2-135m-instruct", None)
    assert config.sampler.sampling.max_new_tokens == quickstart.sampler.sampling.max_new_tokens
    assert config.sampler.max_context_tokens == quickstart.sampler.max_context_tokens
    assert config.env.options == quickstart.env.options and config.model.name == "smollm2-135m-instruct"
    defaults = build_config(EvalOptions(env="babyai"), "smollm2-135m-instruct", None)
    assert defaults.sampler.max_context_tokens != config.sampler.max_context_tokens  # what --config is for
    _, policy, run_dir = resolve_checkpoint(str(make_checkpoint(tmp_path / "run", 2)))
    with pytest.raises(EvalError, match="plays with its run's config"):
        build_config(EvalOptions(env="babyai", config=str(preset)), str(policy), run_dir)


def test_a_mixed_runs_checkpoint_plays_each_env_with_its_entrys_options(tmp_path: Path):
    checkpoint = make_checkpoint(tmp_path / "run", 2)
    mix = {
        "warm_start": {"iterations": 0},
        "trainer": {"tasks_per_iteration": 2},
        "envs": [
            {"name": "babyai", "options": {"levels": ["GoToObjS6"]}},
            {"name": "textcraft", "options": {"distractors": 2}},
        ],
    }
    (tmp_path / "run" / "config.yaml").write_text(dump_config(Config.model_validate(mix)))
    _, policy, run_dir = resolve_checkpoint(str(checkpoint))
    assert build_config(EvalOptions(env="babyai"), str(policy), run_dir).env.options == {"levels": ["GoToObjS6"]}
    textcraft = build_config(EvalOptions(env="textcraft"), str(policy), run_dir)
    assert textcraft.env.options == {"distractors": 2} and textcraft.envs == []
    assert build_config(EvalOptions(env="sciworld"), str(policy), run_dir).env.options == {}

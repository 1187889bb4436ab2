"""`env.action_format: tools` through the real CLI on tiny-random: `train` on a mix of BabyAI, TextCraft and Deep
Search in tool format, its samplers playing each env's oracle (the warm start's demonstrations, written as calls)
and the learner fitting them with SFT; then `eval` of its checkpoint on each env, the model playing in the format
the run trained in. Tiny-random's own replies in tool format are unit-tested (tests/unit/actors/test_rollout_tools.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.e2e.helpers import run_cli

ENVS = ("babyai", "textcraft", "search")


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished one-iteration tool-format run: its directory (under which `eval` writes its reports)."""
    root = tmp_path_factory.mktemp("tools")
    options = {
        "babyai": {"levels": ["GoToRedBall"], "oracle": True},
        "textcraft": {"distractors": 2},
        "search": {"cache_dir": str(root / "search-cache")},
    }
    config = {
        "run": {"dir": str(root / "runs"), "name": "tools", "seed": 0},
        "model": {"name": "tiny-random"},
        "envs": [{"name": name, "action_format": "tools", "options": options[name]} for name in ENVS],
        "sampler": {
            "policy": "oracle",
            "count": 1,
            "envs_per_sampler": 1,
            "num_cpus": 0.25,
            "dtype": "float32",
            "max_context_tokens": 16000,
            "sampling": {"max_new_tokens": 16},
        },
        "algorithm": {"name": "sft", "group_size": 1},
        "learner": {"num_cpus": 0.5, "precision": "float32", "micro_batch_size": 2, "minibatches": 1},
        "curriculum": {"schedule": "fixed", "horizon": 30},  # each oracle finishes its task well within 30 turns
        "warm_start": {"iterations": 0},
        "trainer": {"iterations": 1, "tasks_per_iteration": 3, "checkpoint_every": 1, "heldout_tasks": 0},
        "logging": {"progress": False},
        "ray": {"num_cpus": 2},
    }
    path = root / "tools.yaml"
    path.write_text(yaml.safe_dump(config))
    done = run_cli("train", str(path), cwd=root)
    assert done.returncode == 0, done.stderr[-3000:]
    return root / "runs" / "tools"


@pytest.mark.slow
def test_train_plays_every_env_by_calls_and_the_oracle_written_as_calls_wins(run: Path):
    demos = lines(run / "trajectories" / "iter_000000.jsonl")
    assert sorted(d["env"] for d in demos) == sorted(ENVS)
    for demo in demos:
        assert demo["success"] and demo["done"], demo["env"]
        system = demo["messages"][0]["content"]
        assert "<tools>" in system and '"name": "' in system  # the env's functions, offered
        replies = [m["content"] for m in demo["messages"] if m["role"] == "assistant"]
        assert all(reply.startswith('<tool_call>\n{"name": "') for reply in replies)
        # every call gets its result; the last step ended the episode, so nothing answers it
        results = [m["content"] for m in demo["messages"][2:] if m["role"] == "user"]
        assert len(results) == len(replies) - 1 and all(r.startswith("<tool_response>\n") for r in results)
        assert all(action for action in demo["actions"])  # each turn sent its call's action text to the env
    record = lines(run / "metrics.jsonl")
    assert [r["iteration"] for r in record] == [0] and record[0]["success_rate"] == 1.0
    assert (run / "checkpoints" / "iter_000001" / "policy").is_dir()


@pytest.mark.slow  # an eval run of its own after the module's training run: in the slow tier's rotation
def test_eval_plays_the_checkpoint_in_the_format_it_trained_in(run: Path):
    envs = [item for env in ENVS for item in ("--env", env)]  # one eval, one report per env
    done = run_cli(
        "eval", "--checkpoint", str(run), *envs, "--episodes", "1", "--max-turns", "2",
        "--set", "sampler.envs_per_sampler=1", cwd=run,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    for env in ENVS:
        report = json.loads((run / "eval" / f"{env}-tools-test-iter_000001.json").read_text())
        assert report["action_format"] == "tools", env
        assert report["overall"]["episodes"] == 1 and 1 <= report["results"][0]["turns"] <= 2, env


@pytest.mark.parametrize(
    ("settings", "error"),
    [
        (
            ["env.name=target-word"],
            "env.action_format=tools: env 'target-word' describes no actions as functions; envs that do: babyai,",
        ),
        (
            ["model.name=tiny-random", "model.adapter=null", "model.tool_format=nope"],
            "invalid config: model.tool_format: unknown tool format 'nope'; registered: hermes",
        ),
    ],
)
def test_a_tool_format_run_that_cannot_work_is_refused_before_it_starts(tmp_path: Path, settings, error):
    sets = [item for setting in ["env.action_format=tools", *settings] for item in ("--set", setting)]
    done = run_cli("train", *sets, cwd=tmp_path)
    assert done.returncode == 2 and error in done.stderr

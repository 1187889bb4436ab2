"""Trajectory export / import: the format, token-exact re-rendering, and training on imported data."""

import asyncio
import json
from pathlib import Path

import pytest

from agentgym_rl.actors.chat import ChatFormat
from agentgym_rl.actors.engines.base import Generation
from agentgym_rl.actors.rollout import run_episode
from agentgym_rl.actors.rundir import RunDir
from agentgym_rl.actors.trajectory import Trajectory
from agentgym_rl.configs import Config
from agentgym_rl.configs.loader import apply_override
from agentgym_rl.driver.cli import main
from agentgym_rl.driver.data import DataError, load_trajectories, trajectory_files
from agentgym_rl.envs import make
from agentgym_rl.learner.actor import LearnerActor

LEVELS = {"levels": ["GoToRedBall"]}


def oracle_episodes(tokenizer, tasks: int, horizons: tuple[int, ...]) -> list[Trajectory]:
    """BabyAI episodes written by the env's oracle, token-exact as the oracle sampler makes them:
    for each of the first ``tasks`` train tasks, one episode per horizon (a short horizon cuts the
    episode before the goal, so the same task has a failure and a success)."""
    env = make("babyai", LEVELS)
    chat = ChatFormat(tokenizer)

    async def reset(task_id):
        return env.reset(task_id)

    async def step(text):
        return env.step(text)

    async def generate(prompt):
        ids = [*chat.encode(f"Action: {env.oracle_action()}"), tokenizer.eos_token_id]
        return Generation(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop"), 0

    episodes = []
    for group, task_id in enumerate(list(env.tasks("train"))[:tasks]):
        for horizon in horizons:
            episodes.append(
                asyncio.run(
                    run_episode(
                        env_name="babyai",
                        instruction=env.instruction,
                        reset=reset,
                        step=step,
                        generate=generate,
                        chat=chat,
                        task_id=task_id,
                        group=group,
                        horizon=horizon,
                        max_new_tokens=16,
                        max_context_tokens=4096,
                    )
                )
            )
    env.close()
    return episodes


def strip_token_ids(source: Path, target: Path) -> None:
    """The export file without token ids, as episodes logged by another tool would come."""
    lines = []
    for line in source.read_text().splitlines():
        record = json.loads(line)
        record.pop("token_ids"), record.pop("loss_mask")
        lines.append(json.dumps(record))
    target.write_text("\n".join(lines) + "\n")


def sft_loss(trajectories: list[Trajectory]) -> float:
    data: dict = {}
    for item in ["model.name=tiny-random", "algorithm.name=sft", "learner.lr=1e-3", "learner.micro_batch_size=2"]:
        apply_override(data, item)
    config = Config.model_validate(data)
    learner = LearnerActor(model=config.model, learner=config.learner, algorithm=config.algorithm, seed=0)
    return learner.update_batch(trajectories)["learner/loss"]


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory, tokenizer) -> tuple[Path, list[Trajectory]]:
    run = RunDir(tmp_path_factory.mktemp("logged"))
    episodes = oracle_episodes(tokenizer, tasks=2, horizons=(2, 30))
    run.trajectories.mkdir(parents=True)
    run.write_trajectories(0, episodes[:2])
    run.write_trajectories(1, episodes[2:])
    return run.path, episodes


def test_export_then_import_without_token_ids_is_token_exact_and_trains_the_same(logged_run, tmp_path, capsys):
    run_path, episodes = logged_run
    assert any(t.success for t in episodes) and any(t.truncated for t in episodes)
    exported = tmp_path / "episodes.jsonl"
    assert main(["data", "export", str(run_path), "--output", str(exported)]) == 0
    records = [json.loads(line) for line in exported.read_text().splitlines()]
    assert [r["iteration"] for r in records] == [0, 0, 1, 1]
    first = records[0]
    for key in ("env", "task_id", "messages", "actions", "step_rewards", "reward", "success", "token_ids", "loss_mask"):
        assert key in first, key
    assert first["messages"][0]["role"] == "system" and first["messages"][2]["role"] == "assistant"

    plain = tmp_path / "plain.jsonl"
    strip_token_ids(exported, plain)
    assert main(["data", "import", str(plain), "--run-dir", str(tmp_path / "imported"), "--model", "tiny-random"]) == 0
    assert "imported 4 episodes" in capsys.readouterr().out
    imported = load_trajectories([str(tmp_path / "imported")])
    for original, again in zip(episodes, imported, strict=True):
        assert again.token_ids == original.token_ids  # the trailing observation of a cut episode is not in the ids
        assert again.loss_mask == original.loss_mask
        assert again.turn_spans == original.turn_spans
        assert (again.reward, again.success, again.truncated) == (original.reward, original.success, original.truncated)
    assert [t.group for t in imported] == [0, 0, 1, 1]  # one group per task
    assert sft_loss(imported) == pytest.approx(sft_loss(episodes), rel=1e-6)


def test_import_keeps_given_token_ids(logged_run, tmp_path):
    run_path, episodes = logged_run
    exported = tmp_path / "episodes.jsonl"
    assert main(["data", "export", str(run_path), "--output", str(exported)]) == 0
    assert main(["data", "import", str(exported), "--run-dir", str(tmp_path / "again")]) == 0
    imported = load_trajectories([str(tmp_path / "again" / "trajectories" / "iter_000000.jsonl")])
    assert [t.token_ids for t in imported] == [t.token_ids for t in episodes]


def test_bad_input_is_named_by_file_and_line(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    good = {"env": "babyai", "task_id": 1, "messages": [{"role": "user", "content": "hi"}], "reward": 0, "success": 0}
    bad.write_text(json.dumps({**good, "messages": [*good["messages"], {"role": "assistant", "content": "a"}]}) + "\n")
    bad.write_text(bad.read_text() + json.dumps({**good, "token_ids": [1, 2]}) + "\n")
    assert main(["data", "import", str(bad), "--run-dir", str(tmp_path / "out"), "--model", "tiny-random"]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:2" in err and "token_ids and loss_mask go together" in err
    assert not (tmp_path / "out" / "trajectories").exists()
    with pytest.raises(DataError, match="no trajectory file"):
        trajectory_files([str(tmp_path / "missing")])
    with pytest.raises(DataError, match="data import"):
        load_trajectories([str(bad)])


def test_import_refuses_a_directory_with_trajectories(logged_run, tmp_path, capsys):
    run_path, _ = logged_run
    exported = tmp_path / "episodes.jsonl"
    assert main(["data", "export", str(run_path), "--output", str(exported)]) == 0
    assert main(["data", "import", str(exported), "--run-dir", str(run_path)]) == 2
    assert "already holds trajectories" in capsys.readouterr().err

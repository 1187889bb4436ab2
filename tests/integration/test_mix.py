"""Multi-env training on local Ray: BabyAI (stepwise [1, 2], advancing every 2) and TextCraft (fixed 3) in one run,
each with its own samplers, horizon, task draw and metrics; a resume lands on the same per-env horizons."""

import json
from pathlib import Path

import pytest

from agentgym_rl.driver.mix import schedule_seed
from agentgym_rl.driver.modes.asynchronous import AsyncTrainer
from agentgym_rl.driver.modes.sync import SyncTrainer
from agentgym_rl.driver.run import prepare_run
from agentgym_rl.driver.tasks import TaskSchedule
from agentgym_rl.driver.warm_start import WARM_START_DIR, run_warm_start
from agentgym_rl.envs import make
from tests.factories import RECIPE

BABYAI_OPTIONS = {"levels": ["GoToRedBall", "GoToRedBallNoDists"], "test_seeds": 5}
MIX = (
    "envs=["
    "{name: babyai, weight: 2, options: {levels: [GoToRedBall, GoToRedBallNoDists], test_seeds: 5},"
    " curriculum: {schedule: stepwise, horizons: [1, 2], advance_every: 2}},"
    "{name: textcraft, weight: 1, curriculum: {schedule: fixed, horizon: 3}}]"
)
SETTINGS = [
    "model.name=tiny-random",
    "warm_start.iterations=0",
    "logging.progress=false",
    "algorithm.group_size=2",
    "algorithm.entropy_coef=0.01",
    # tiny-random never succeeds: every group is uniform, which GRPO would otherwise skip
    "algorithm.skip_uniform_groups=false",
    "learner.lr=1e-3",
    "learner.num_cpus=0.5",
    "learner.gradient_checkpointing=false",
    "sampler.num_cpus=0.25",
    "sampler.envs_per_sampler=2",
    "sampler.sampling.max_new_tokens=8",
    "trainer.tasks_per_iteration=3",
    "trainer.checkpoint_every=1",
    MIX,
]
# iteration -> (babyai horizon, textcraft horizon)
HORIZONS = {0: (1, 3), 1: (1, 3), 2: (2, 3)}
TASKS = {"babyai": 2, "textcraft": 1}  # 3 tasks shared 2 : 1


def train(overrides: list[str], resume: str | None = None) -> Path:
    config, run_dir = prepare_run(RECIPE, overrides, resume)
    trainer = SyncTrainer(config, run_dir, resume=resume is not None)
    try:
        trainer.run()
    finally:
        trainer.stop_actors()
    return run_dir.path


def episodes(run_dir: Path, iteration: int) -> list[dict]:
    lines = (run_dir / "trajectories" / f"iter_{iteration:06d}.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def drawn_tasks(name: str, options: dict, index: int, iteration: int) -> set[int]:
    """The tasks env ``index`` of the mix draws at ``iteration`` (its own seeded draw from iteration 0 on)."""
    env = make(name, options)
    schedule = TaskSchedule(list(env.tasks("train")), TASKS[name], schedule_seed(0, index))
    env.close()
    return [set(schedule.next()) for _ in range(iteration + 1)][-1]


@pytest.mark.slow
def test_a_mix_trains_each_env_at_its_own_horizon_and_resumes_on_them(ray_local, tmp_path: Path):
    common = [*SETTINGS, f"run.dir={tmp_path}", "run.name=mix"]
    run_dir = train([*common, "trainer.iterations=2"])
    train(["trainer.iterations=3"], resume=str(run_dir))

    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in records] == [0, 1, 2]
    for record in records:
        babyai, textcraft = HORIZONS[record["iteration"]]
        assert record["env/babyai/horizon"] == babyai and record["env/textcraft/horizon"] == textcraft
        assert record["horizon"] == max(babyai, textcraft)
        assert record["env/babyai/episodes"] == 4 and record["env/textcraft/episodes"] == 2
        assert record["rollout/episodes"] == 6 and record["pool/samplers"] == 2
        for name in TASKS:
            assert 0.0 <= record[f"env/{name}/success_rate"] <= 1.0
            assert 0.0 <= record[f"env/{name}/truncated_rate"] <= 1.0
            assert f"env/{name}/mean_reward" in record
        # the overall keys stay, over all episodes
        assert record["rollout/truncated_rate"] == pytest.approx(
            (4 * record["env/babyai/truncated_rate"] + 2 * record["env/textcraft/truncated_rate"]) / 6
        )
        for key in ("success_rate", "mean_reward", "learner/loss"):
            assert key in record
    # one weight version per update, and every sampler of both envs played on the newest weights
    assert [r["weights_version"] for r in records] == [1, 2, 3]

    state = json.loads((run_dir / "checkpoints" / "iter_000002" / "trainer.json").read_text())
    assert sorted(state["envs"]) == ["babyai", "textcraft"] and "curriculum" not in state
    assert state["envs"]["babyai"]["curriculum"]["horizon"] == 1
    assert state["envs"]["textcraft"]["curriculum"]["horizon"] == 3

    for iteration, (babyai_horizon, textcraft_horizon) in HORIZONS.items():
        played = episodes(run_dir, iteration)
        by_env = {name: [e for e in played if e["env"] == name] for name in TASKS}
        assert {name: len(eps) for name, eps in by_env.items()} == {"babyai": 4, "textcraft": 2}
        assert all(e["weights_version"] == iteration for e in played)
        for name, horizon in (("babyai", babyai_horizon), ("textcraft", textcraft_horizon)):
            for episode in by_env[name]:
                assert episode["horizon"] == horizon
                assert len(episode["turn_spans"]) <= horizon
            # tiny-random never finishes a task: the env's own turn limit is what ends its episodes
            assert any(len(e["turn_spans"]) == horizon and e["truncation_reason"] == "horizon" for e in by_env[name])
        assert all(e["messages"][1]["content"].startswith("Your goal:") for e in by_env["babyai"])
        assert all(e["messages"][1]["content"].startswith("Crafting commands:") for e in by_env["textcraft"])
        # groups are numbered across envs: BabyAI's two tasks first, then TextCraft's
        assert sorted({e["group"] for e in by_env["babyai"]}) == [0, 1] and {
            e["group"] for e in by_env["textcraft"]
        } == {2}
        # each env draws from its own seeded schedule, and the resumed iteration 2 continues those draws
        assert {e["task_id"] for e in by_env["babyai"]} == drawn_tasks("babyai", BABYAI_OPTIONS, 0, iteration)
        assert {e["task_id"] for e in by_env["textcraft"]} == drawn_tasks("textcraft", {}, 1, iteration)


@pytest.mark.slow
def test_an_async_mix_records_each_env_at_its_own_horizon(ray_local, tmp_path: Path):
    overrides = [*SETTINGS, f"run.dir={tmp_path}", "run.name=async", "trainer.mode=async", "trainer.iterations=3"]
    config, run_dir = prepare_run(RECIPE, overrides, None)
    trainer = AsyncTrainer(config, run_dir)
    try:
        trainer.run()
    finally:
        trainer.stop_actors()
    records = run_dir.read_metrics()
    assert [r["iteration"] for r in records] == [0, 1, 2]
    for record in records:
        babyai, textcraft = HORIZONS[record["iteration"]]
        assert (record["env/babyai/horizon"], record["env/textcraft/horizon"]) == (babyai, textcraft)
        kept = record["rollout/episodes"]
        assert record["env/babyai/episodes"] + record["env/textcraft/episodes"] == kept
    for iteration, horizons in HORIZONS.items():
        for episode in episodes(run_dir.path, iteration):
            assert episode["horizon"] == horizons[0 if episode["env"] == "babyai" else 1]
    state = json.loads((run_dir.path / "checkpoints" / "iter_000003" / "trainer.json").read_text())
    assert sorted(state["envs"]) == ["babyai", "textcraft"]


@pytest.mark.slow
def test_a_mix_warm_starts_on_the_oracle_of_each_env(ray_local, tmp_path: Path):
    mix = MIX.replace("test_seeds: 5}", "test_seeds: 5}, warm_start_options: {oracle: true}")
    warm = ["warm_start.iterations=1", "warm_start.env_options={}", "warm_start.tasks_per_iteration=3"]
    overrides = [*SETTINGS, mix, *warm, "warm_start.horizon=12", f"run.dir={tmp_path}", "run.name=warm"]
    config, run_dir = prepare_run(RECIPE, overrides, None)
    policy = run_warm_start(config, run_dir)
    assert (policy / "config.json").is_file()

    warm_dir = run_dir.path / WARM_START_DIR
    (record,) = [json.loads(line) for line in (warm_dir / "metrics.jsonl").read_text().splitlines()]
    played = episodes(warm_dir, 0)
    assert sorted(e["env"] for e in played) == ["babyai", "babyai", "textcraft"]  # 3 tasks 2 : 1, one episode each
    # each env's oracle solves its tasks within the warm start's horizon, and SFT trains on them
    assert all(e["success"] and e["horizon"] == 12 and len(e["turn_spans"]) <= 12 for e in played), played
    assert record["env/babyai/success_rate"] == record["env/textcraft/success_rate"] == 1.0
    assert record["env/babyai/horizon"] == record["env/textcraft/horizon"] == 12
    assert record["learner/loss"] > 0
    # the RL config keeps the schedules and options of its own entries
    assert config.envs[0].curriculum.horizons == [1, 2] and "oracle" not in config.envs[0].options

"""Multi-env training without Ray: task apportionment, the `envs` config checks, derived per-env configs."""

import pytest

from agentgym_rl.configs import ConfigError, dump_config, load_config
from agentgym_rl.driver.mix import apportion, check_envs, env_metrics, env_run_config, mix_entries, schedule_seed
from agentgym_rl.driver.tasks import TaskSchedule
from agentgym_rl.driver.warm_start import warm_start_config

MIX = [
    "warm_start.iterations=0",
    "trainer.tasks_per_iteration=3",
    "envs=[{name: babyai, weight: 2}, {name: textcraft, curriculum: {schedule: fixed, horizon: 3}}]",
]


@pytest.mark.parametrize(
    ("total", "weights", "expected"),
    [
        (4, [1.0], [4]),
        (10, [2, 1], [7, 3]),  # quotas 6.67 and 3.33: the larger remainder takes the free seat
        (3, [2, 1], [2, 1]),
        (6, [1, 1, 1], [2, 2, 2]),
        (7, [1, 1, 1], [3, 2, 2]),  # equal remainders: the earliest env first
        (3, [100, 1, 1], [1, 1, 1]),  # every env at least one
        (5, [100, 1, 1], [3, 1, 1]),  # the at-least-one seats are taken back from the largest share
        (10, [0.1, 0.2, 0.7], [1, 2, 7]),  # exact arithmetic: 0.1 + 0.2 + 0.7 loses no seat to rounding
        (8, [3, 3, 1, 1], [3, 3, 1, 1]),
    ],
)
def test_apportion_is_largest_remainder_with_at_least_one_each(total, weights, expected):
    counts = apportion(total, weights)
    assert counts == expected
    assert sum(counts) == total


def test_apportion_follows_the_weights_as_the_total_grows():
    for total in range(3, 60):
        counts = apportion(total, [3.0, 2.0, 1.0])
        assert sum(counts) == total and min(counts) >= 1
        quotas = [total * w / 6 for w in (3, 2, 1)]
        assert all(abs(c - q) < 1 for c, q in zip(counts, quotas, strict=True))


@pytest.mark.parametrize(
    ("total", "weights", "says"),
    [(1, [1, 1], "at least one"), (3, [], "at least one weight"), (3, [1, 0], "positive")],
)
def test_apportion_rejects_impossible_shares(total, weights, says):
    with pytest.raises(ValueError, match=says):
        apportion(total, weights)


def test_no_envs_is_a_one_entry_mix_of_env_with_the_run_config_and_seed():
    config = load_config(None, ["env.options.levels=[GoToRedBall]"])
    (entry,) = mix_entries(config)
    assert (entry.name, entry.split, entry.options, entry.curriculum) == ("babyai", "train", config.env.options, None)
    assert env_run_config(config, entry) is config
    assert schedule_seed(config.run.seed, 0) == config.run.seed
    # the first env draws exactly as a one-env run always did
    ours, before = TaskSchedule(list(range(50)), 4, schedule_seed(7, 0)), TaskSchedule(list(range(50)), 4, 7)
    assert [ours.next() for _ in range(3)] == [before.next() for _ in range(3)]


def test_each_env_gets_its_own_env_section_curriculum_and_seed():
    config = load_config(None, MIX)
    babyai, textcraft = mix_entries(config)
    derived = env_run_config(config, babyai)
    assert derived.env.name == "babyai" and derived.curriculum == config.curriculum and derived.envs == []
    derived = env_run_config(config, textcraft)
    assert derived.env.name == "textcraft" and derived.env.split == "train"
    assert (derived.curriculum.schedule, derived.curriculum.horizon) == ("fixed", 3)
    assert derived.sampler == config.sampler and derived.run.seed == config.run.seed
    assert schedule_seed(0, 1) != schedule_seed(0, 2) and schedule_seed(0, 1) != schedule_seed(1, 1)


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["envs=[{name: babyai}, {name: babyai, weight: 3}]"], "'babyai'.*more than once"),
        (["envs=[{name: babyai, weight: 0}]"], "envs.0.weight"),
        (["envs=[{name: babyai, speed: 2}]"], "envs.0.speed: unknown key"),
        (["trainer.mode=offline", "data.files=[x.jsonl]"], "supports trainer.mode sync or async.*'offline'"),
        (["warm_start.iterations=2", "warm_start.env_options={oracle: true}"], r"envs\[i\]\.warm_start_options"),
        (["warm_start.iterations=2", "warm_start.env_options={}", "warm_start.tasks_per_iteration=1"], "below the 2"),
        (["trainer.tasks_per_iteration=1"], "tasks_per_iteration=1 is below the 2 envs"),
    ],
)
def test_bad_mixes_are_rejected_with_the_reason(overrides, says):
    with pytest.raises(ConfigError, match=says):
        load_config(None, [*MIX, *overrides])


def test_async_mode_takes_a_mix():
    assert load_config(None, [*MIX, "trainer.mode=async"]).trainer.mode == "async"


def test_an_unknown_env_in_the_mix_names_the_entry_and_the_registered_envs():
    config = load_config(None, [*MIX, "envs=[{name: babyai}, {name: minecraft}]"])
    with pytest.raises(ConfigError, match=r"envs\[1\]\.name: unknown env 'minecraft'; registered envs: .*textcraft"):
        check_envs(config)
    check_envs(load_config(None, MIX))


@pytest.mark.parametrize(
    ("envs", "says"),
    [
        (
            "[{name: textcraft}, {name: babyai, options: {oracle: false}}]",
            r"envs\[1\]\.options\.oracle=false turns off",
        ),
        ("[{name: babyai}, {name: mcp, options: {command: [x]}}]", r"env 'mcp' \(envs\[1\]\.name\) has no oracle"),
    ],
)
def test_the_oracle_policy_needs_every_envs_oracle_on(envs, says):
    with pytest.raises(ConfigError, match=says):
        check_envs(load_config(None, [*MIX, "sampler.policy=oracle", f"envs={envs}"]))
    # BabyAI's bot is on by default; TextCraft's recipe solver needs no option.
    check_envs(load_config(None, [*MIX, "sampler.policy=oracle"]))


def test_env_metrics_are_namespaced_by_env():
    report = {"success_rate": 0.5, "mean_reward": 0.25, "rollout/truncated_rate": 0.75, "rollout/episodes": 4.0}
    assert env_metrics("textcraft", report, 4, 3) == {
        "env/textcraft/success_rate": 0.5,
        "env/textcraft/mean_reward": 0.25,
        "env/textcraft/horizon": 3,
        "env/textcraft/episodes": 4.0,
        "env/textcraft/truncated_rate": 0.75,
    }


def test_the_mix_preset_shares_tasks_two_to_one_with_its_own_horizons():
    config = load_config("mix.yaml")
    check_envs(config)
    assert [e.name for e in config.envs] == ["babyai", "textcraft"]
    assert apportion(config.trainer.tasks_per_iteration, [e.weight for e in config.envs]) == [2, 1]
    babyai, textcraft = (env_run_config(config, e).curriculum for e in config.envs)
    assert (babyai.schedule, babyai.horizons) == ("stepwise", [3, 6, 10])
    assert (textcraft.schedule, textcraft.horizon) == ("fixed", 8)
    warm = warm_start_config(config)
    assert [(e.options.get("oracle"), e.curriculum.horizon) for e in warm.envs] == [(True, 10), (None, 8)]
    assert apportion(warm.trainer.tasks_per_iteration, [e.weight for e in warm.envs]) == [6, 3]


def test_a_mix_survives_the_run_directory_config_round_trip(tmp_path):
    config = load_config(None, MIX)
    saved = tmp_path / "config.yaml"
    saved.write_text(dump_config(config))
    assert load_config(saved) == config

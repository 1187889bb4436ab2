from pathlib import Path

import pytest
import structlog.testing

from agentgym_rl.configs import Config, ConfigError, dump_config, load_config
from agentgym_rl.configs.loader import parse_override


def test_quickstart_preset_loads_with_defaults_for_missing_keys():
    config = load_config()
    assert config.model.name == "smollm2-135m-instruct"
    assert config.env.name == "babyai"
    assert config.curriculum.schedule == "stepwise"


@pytest.mark.parametrize(
    ("override", "path", "expected"),
    [
        ("trainer.iterations=2", ("trainer", "iterations"), 2),
        ("learner.lr=3e-5", ("learner", "lr"), 3e-5),
        ("curriculum.horizons=[2, 4]", ("curriculum", "horizons"), [2, 4]),
        ("model.name=tiny-random", ("model", "name"), "tiny-random"),
        ("logging.progress=false", ("logging", "progress"), False),
    ],
)
def test_overrides_are_parsed_as_yaml_values(override, path, expected):
    config = load_config(None, [override])
    section, key = path
    assert getattr(getattr(config, section), key) == expected


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("trainer.iterationz=2", "trainer.iterationz"),
        ("bogus.key=1", "bogus"),
        ("sampler.sampling.temprature=0.5", "sampler.sampling.temprature"),
    ],
)
def test_unknown_key_error_names_the_key(override, named):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert named in str(info.value)
    assert "unknown key" in str(info.value)


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("trainer.iterations=0", "trainer.iterations"),
        ("sampler.sampling.temperature=-1", "sampler.sampling.temperature"),
        ("curriculum.horizons=[10, 5]", "horizons"),
        ("learner.count=2", "deepspeed"),
        ("learner.zero_stage=4", "learner.zero_stage"),
        ("algorithm.group_size=abc", "algorithm.group_size"),
    ],
)
def test_bad_values_are_rejected_with_the_field_named(override, named):
    with pytest.raises(ConfigError) as info:
        load_config(None, [override])
    assert named in str(info.value)


def test_malformed_override_and_missing_file_are_explained(tmp_path: Path):
    with pytest.raises(ConfigError, match="section.key=value"):
        parse_override("trainer.iterations")
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("run: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_dumped_config_loads_back_identically(tmp_path: Path):
    config = load_config(None, ["run.seed=7", "curriculum.horizons=[1, 2, 3]"])
    saved = tmp_path / "config.yaml"
    saved.write_text(dump_config(config))
    assert load_config(saved) == config
    assert Config.model_validate(config.model_dump()) == config


# Hyperparameter keys per algorithm, as the learner's registry would answer them.
KEYS = {"grpo": {"aggregation", "clip_eps", "kl_coef", "entropy_coef"}, "sft": {"aggregation"}}


def switch(*overrides: str) -> tuple[Config, list[dict]]:
    with structlog.testing.capture_logs() as logs:
        config = load_config(None, list(overrides), algorithm_keys=KEYS.get)
    return config, logs


def test_switching_algorithm_drops_the_presets_keys_it_does_not_know_with_one_warning():
    config, logs = switch("algorithm.name=sft", "algorithm.group_size=2")
    assert config.algorithm.name == "sft" and config.algorithm.group_size == 2
    assert config.algorithm.model_extra == {}
    assert len(logs) == 1 and logs[0]["log_level"] == "warning"
    assert logs[0]["dropped"] == ["algorithm.clip_eps", "algorithm.kl_coef", "algorithm.entropy_coef"]
    assert logs[0]["algorithm"] == "sft" and logs[0]["file"].endswith("quickstart.yaml")


def test_keys_set_on_the_command_line_are_kept_for_strict_validation():
    config, logs = switch("algorithm.name=sft", "algorithm.clip_epz=0.1", "algorithm.kl_coef=0.5")
    # Kept (the learner's check then refuses both, naming them); only the preset's own keys are dropped.
    assert config.algorithm.model_extra == {"clip_epz": 0.1, "kl_coef": 0.5}
    assert logs[0]["dropped"] == ["algorithm.clip_eps", "algorithm.entropy_coef"]


@pytest.mark.parametrize(
    "overrides",
    [
        ["algorithm.clip_eps=0.3"],  # no switch
        ["algorithm.name=grpo"],  # the preset's own algorithm
        ["algorithm.name=no_such_algo"],  # unknown: the learner's check reports it
    ],
)
def test_nothing_is_dropped_without_a_switch_to_a_known_algorithm(overrides):
    config, logs = switch(*overrides)
    assert {"clip_eps", "kl_coef", "entropy_coef"} <= set(config.algorithm.model_extra)
    assert logs == []


def test_without_algorithm_keys_the_loader_drops_nothing():
    config = load_config(None, ["algorithm.name=sft"])
    assert {"clip_eps", "kl_coef", "entropy_coef"} <= set(config.algorithm.model_extra)


def test_colocated_placement_names_every_setting_it_needs():
    with pytest.raises(ConfigError) as caught:
        load_config(
            None,
            [
                "trainer.placement=colocated",
                "trainer.mode=async",
                "sampler.count=2",
                "sampler.max_count=3",
                "sampler.num_gpus=1",
                "sampler.engine=vllm",
            ],
        )
    message = str(caught.value)
    for needed in (
        "trainer.mode=sync (got 'async')",
        "sampler.count = learner.count = 1 (got sampler.count=2)",
        "sampler.max_count unset (got 3)",
        "sampler.num_gpus unset",
        "sampler.vllm.enable_sleep_mode=true",
    ):
        assert needed in message, needed
    fitting = load_config(
        None, ["trainer.placement=colocated", "learner.count=2", "learner.backend=deepspeed", "sampler.count=2"]
    )
    assert fitting.trainer.placement == "colocated"

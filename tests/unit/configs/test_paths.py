"""Relative input paths of a config resolve the same wherever the command runs (configs/loader.py)."""

from pathlib import Path

import pytest
import yaml

from agentgym_rl.configs import dump_config, load_config

REPO = Path(__file__).resolve().parents[3]


def write_config(folder: Path, data: dict) -> Path:
    file = folder / "config.yaml"
    file.write_text(yaml.safe_dump(data))
    return file


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory outside the repository and apart from the config files the tests write."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return Path.cwd()


def test_a_presets_adapter_resolves_against_the_repository_root_from_anywhere(elsewhere):
    config = load_config()  # the quickstart preset
    assert config.model.adapter == str(REPO / "docs/results/babyai/sft/adapter")
    assert Path(config.model.adapter, "adapter_config.json").is_file()
    assert config.model.name == "smollm2-135m-instruct"  # a built-in name stays a name
    assert config.run.dir == "runs"  # an output path stays relative to the working directory


def test_a_committed_stage_config_outside_configs_resolves_against_the_repository_root(elsewhere):
    config = load_config(REPO / "docs/results/babyai/grpo_stepwise/config.yaml")
    assert config.model.adapter == str(REPO / "docs/results/babyai/sft/adapter")


def test_a_config_outside_the_repository_resolves_against_its_own_folder(tmp_path, elsewhere):
    folder = tmp_path / "experiment"
    folder.mkdir()
    (folder / "local-model").mkdir()
    file = write_config(
        folder,
        {
            "model": {"name": "local-model", "adapter": "stages/sft/adapter"},
            "data": {"files": ["logs/*.jsonl", "../runs/first", str(tmp_path / "demos.jsonl")]},
        },
    )
    config = load_config(file)
    assert config.model.adapter == str(folder / "stages/sft/adapter")
    assert config.model.name == str(folder / "local-model")
    assert config.data.files == [
        str(folder / "logs/*.jsonl"),
        str(folder / "../runs/first"),
        str(tmp_path / "demos.jsonl"),
    ]


def test_overrides_resolve_against_the_working_directory(tmp_path, elsewhere):
    (elsewhere / "my-model").mkdir()
    file = write_config(tmp_path, {"model": {"adapter": "in-file"}})
    config = load_config(
        file, ["model.adapter=./mine/adapter", "model.name=my-model", "data.files=[a.jsonl, 'runs/*/trajectories']"]
    )
    assert config.model.adapter == str(elsewhere / "mine/adapter")
    assert config.model.name == str(elsewhere / "my-model")
    assert config.data.files == [str(elsewhere / "a.jsonl"), str(elsewhere / "runs/*/trajectories")]
    whole_section = load_config(file, ["model={name: tiny-random, adapter: typed}"])
    assert whole_section.model.adapter == str(elsewhere / "typed")


def test_a_model_name_that_is_no_folder_under_the_base_is_kept_as_given(tmp_path, elsewhere):
    file = write_config(tmp_path, {"model": {"name": "tiny-random"}})
    assert load_config(file).model.name == "tiny-random"
    assert load_config(file, ["model.name=not-here/model"]).model.name == "not-here/model"


def test_absolute_null_and_home_paths(tmp_path, elsewhere, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    file = write_config(tmp_path, {"model": {"adapter": "/srv/adapters/sft"}, "data": {"files": ["~/demos/*.jsonl"]}})
    config = load_config(file)
    assert config.model.adapter == "/srv/adapters/sft"
    assert config.data.files == [str(tmp_path / "home/demos/*.jsonl")]
    assert load_config(file, ["model.adapter=null"]).model.adapter is None
    assert load_config(file, ["model.adapter=~/a"]).model.adapter == str(tmp_path / "home/a")


def test_a_dumped_config_means_the_same_from_another_folder(tmp_path, elsewhere, monkeypatch):
    saved = tmp_path / "run" / "config.yaml"
    saved.parent.mkdir()
    saved.write_text(dump_config(load_config(None, ["data.files=[logs/a.jsonl]"])))
    monkeypatch.chdir(tmp_path)
    again = load_config(saved)
    assert again.model.adapter == str(REPO / "docs/results/babyai/sft/adapter")
    assert again.data.files == [str(elsewhere / "logs/a.jsonl")]

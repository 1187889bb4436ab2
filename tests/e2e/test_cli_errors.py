"""Every error path of the command line: one line on stderr naming the problem, exit status 2, no traceback."""

import json
import shutil
from pathlib import Path

import pytest

from agentgym_rl.actors.models import model_dir
from agentgym_rl.driver.cli import main


def model_without_chat_template(root: Path) -> Path:
    """tiny-random with its chat template removed: turns cannot be rendered token-exactly."""
    target = root / "no-template"
    shutil.copytree(model_dir("tiny-random"), target)
    (target / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((target / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (target / "tokenizer_config.json").write_text(json.dumps(config))
    return target


CASES = {
    "misspelt config key": (["train", "--set", "trainer.iteratons=2"], "trainer.iteratons: unknown key"),
    "resume of no run": (["train", "--resume", "{tmp}/nowhere"], "no config.yaml there"),
    "time limit not positive": (["train", "--time-limit", "0"], "--time-limit 0"),
    "bad chat template": (
        ["train", "--set", "model.name={template}", "--set", "model.adapter=null", "--set", "run.dir={tmp}"],
        "chat template",
    ),
    "adapter of another base": (["train", "--set", "model.name=tiny-random"], "set model.adapter=null"),
    "unknown env": (["eval", "--model", "tiny-random", "--env", "nonesuch"], "nonesuch"),
    "eval options": (["eval", "--model", "tiny-random", "--env", "babyai", "--samples", "0"], "samples"),
    "missing report": (["compare", "{tmp}/a.json", "{tmp}/b.json"], "a.json"),
    "missing run to plot": (["plot", "{tmp}/none", "--output", "{tmp}/p.png"], "none"),
    "missing run to export": (["data", "export", "{tmp}/none"], "none"),
    "missing run to view": (["view", "{tmp}/none"], "none"),
    "env without what to show": (["envs", "babyai"], "--instruction or --tasks"),
    "unknown env to show": (["envs", "nonesuch", "--instruction"], "nonesuch"),
    "env options not an object": (["envs", "babyai", "--tasks", "test", "--options", "[1]"], "JSON object"),
    "unknown env option": (["envs", "babyai", "--tasks", "test", "--options", '{{"colour": 1}}'], "colour"),
    "unknown split": (["envs", "babyai", "--tasks", "dev"], "'dev'"),
    "serve setting": (["serve", "--model", "tiny-random", "--set", "serve.max_batch_sise=4"], "max_batch_sise"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_an_error_is_one_line_and_exit_2(case: str, tmp_path: Path, capsys):
    argv, named = CASES[case]
    template = model_without_chat_template(tmp_path) if case == "bad chat template" else None
    argv = [arg.format(tmp=tmp_path, template=template) for arg in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("agentgym-rl: error:")]
    assert len(errors) == 1, err
    assert named in errors[0]
    assert "Traceback" not in err


def test_envs_prints_an_envs_instruction_and_task_ids(capsys):
    """What an agent written outside this project needs: the system prompt the env's episodes open with, and
    the ids of a split restricted by the env's options."""
    from agentgym_rl.envs import make

    assert main(["envs", "babyai", "--instruction"]) == 0
    assert capsys.readouterr().out.strip() == make("babyai").instruction.strip()
    options = '{"levels": ["GoToRedBall", "GoToObjS6"], "test_seeds": 2}'
    assert main(["envs", "babyai", "--tasks", "test", "--options", options]) == 0
    # level i of BabyAI's 40 with seed s is task 40 s + i; GoToRedBall is level 1, GoToObjS6 level 3
    assert capsys.readouterr().out.split() == ["1", "3", "41", "43"]

"""The site's generated reference pages: complete, and a config field without a description stops the build."""

from __future__ import annotations

import argparse
import os
import re
import runpy
import shutil
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from agentgym_rl.driver.cli import build_parser
from agentgym_rl.learner.algorithms import algorithm_names, resolve_algorithm

REPO = Path(__file__).resolve().parents[3]
GEN = runpy.run_path(str(REPO / "docs" / "gen_reference.py"), run_name="gen_reference")  # not the build: no pages
MKDOCS = Path(sys.executable).parent / "mkdocs"


def algorithms() -> dict[str, type]:
    return {name: resolve_algorithm(name) for name in algorithm_names()}


def sections(page: str) -> dict[str, list[str]]:
    """Each heading's key column: the first cell of every table row under it."""
    found: dict[str, list[str]] = {}
    heading = ""
    for line in page.splitlines():
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
            found[heading] = []
        elif line.startswith("| `"):
            found[heading].append(line.split("`")[1])
    return found


def walk(model: type[BaseModel], key: str) -> dict[str, list[str]]:
    """Every config model reachable from ``model`` at its dotted key, with its field names."""
    tables = {key: list(model.model_fields)}
    for name, field in model.model_fields.items():
        suffix = "[]" if typing.get_origin(field.annotation) is list else ""
        for sub in GEN["nested_models"](field.annotation):
            tables |= walk(sub, f"{key}.{name}{suffix}")
    return tables


def test_configuration_reference_lists_every_field_of_the_schema():
    schema = GEN["load_schema"](REPO / "configs" / "schema.py")
    page = GEN["config_reference"](schema, algorithms())
    documented = sections(page)
    expected: dict[str, list[str]] = {}
    for name, field in schema.Config.model_fields.items():
        [model] = GEN["nested_models"](field.annotation)
        expected |= walk(model, name + ("[]" if typing.get_origin(field.annotation) is list else ""))
    assert len(expected) > 15
    for key, fields in expected.items():
        assert documented.get(key) == fields, key
    for name, cls in algorithms().items():
        assert documented[name] == list(cls.Config.model_fields), name
    # Every field's row carries its description and default as the schema has them.
    row = next(line for line in page.splitlines() if line.startswith("| `advance_every` |"))
    assert "| int | `10` | `stepwise`: iterations spent at each horizon. |" in row


def test_a_field_without_a_description_is_refused_by_name():
    class Loose(BaseModel):
        colour: str = "blue"

    with pytest.raises(GEN["MissingDescription"], match=r"config field run\.colour \(Loose\.colour\)"):
        GEN["model_tables"](Loose, "run")


def test_cli_reference_lists_every_command_and_option():
    parser = build_parser()
    page = GEN["cli_reference"](parser)
    commands = {}

    def collect(p: argparse.ArgumentParser, prog: str) -> None:
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    commands[f"{prog} {name}"] = sub
                    collect(sub, f"{prog} {name}")

    collect(parser, "agentgym-rl")
    assert {"agentgym-rl train", "agentgym-rl eval", "agentgym-rl data export", "agentgym-rl export"} <= set(commands)
    for command, sub in commands.items():
        assert f"## {command}\n" in page, command
        for action in sub._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert re.search(rf"\| `[^`]*{re.escape(option)}\b", page), f"{command} {option}"


@pytest.mark.slow
@pytest.mark.ci
def test_the_site_build_fails_on_a_config_field_without_a_description(tmp_path: Path):
    copy = tmp_path / "repo"
    shutil.copytree(REPO, copy, ignore=shutil.ignore_patterns(".git", ".venv", "runs", "site", "build", "__pycache__"))
    schema = copy / "configs" / "schema.py"
    text = schema.read_text()
    anchor = '    seed: int = Field(0, description="The one seed behind task sampling, generation sampling and model init.")\n'
    assert anchor in text
    schema.write_text(text.replace(anchor, anchor + "    colour: str = 'blue'\n"))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    build = [str(MKDOCS), "build", "--strict", "-d", str(tmp_path / "site")]
    result = subprocess.run(build, cwd=copy, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode != 0
    # the message pins the cause; that the tree as it is builds, `.ci/run` and tests/e2e/test_docs_site.py show
    assert "config field run.colour (RunConfig.colour) has no description" in result.stdout + result.stderr

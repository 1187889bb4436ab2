"""`agentgym-rl serve --set`: serve.* keys and the model's tool settings, anything else refused by name."""

from __future__ import annotations

import argparse

import pytest

from agentgym_rl.configs.loader import ConfigError
from agentgym_rl.serve.cli import serve_config


def settings(*sets: str):
    """What `agentgym-rl serve --model tiny-random --set ITEM ...` parses to (the parser lives in driver/)."""
    args = argparse.Namespace(model="tiny-random", host="127.0.0.1", port=8000, api_key=None, set=list(sets))
    return serve_config(args)


def test_serve_takes_serve_keys_and_the_models_tool_settings():
    config = settings("serve.max_n=2", "model.tool_format=hermes", "model.tool_template=builtin")
    assert config.serve.max_n == 2 and config.model.tool_format == "hermes" and config.model.tool_template == "builtin"
    assert settings().model.tool_template == "auto"


@pytest.mark.parametrize(
    ("item", "words"),
    [("model.name=x", "takes serve.* keys"), ("model.tool_template=jinja", "tool_template"), ("run.seed=1", "serve.*")],
)
def test_other_keys_and_bad_values_are_refused_by_name(item, words):
    with pytest.raises(ConfigError, match=words):
        settings(item)

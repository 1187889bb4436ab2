"""The serve app chooses its engine through the engine registry, before any replica starts."""

from __future__ import annotations

import pytest

from agentgym_rl.actors.engines import register_engine
from agentgym_rl.configs.schema import ServeConfig
from agentgym_rl.serve.app import ServeArgs, ServeError, build_app, check_engine
from tests.integration.scripted_engine import ScriptedEngine


def test_serving_an_engine_without_a_serving_form_fails_before_any_replica_starts():
    register_engine("unit-scripted", ScriptedEngine)
    with pytest.raises(ServeError, match="has no serving form"):
        build_app(ServeArgs(model="tiny-random", serve=ServeConfig(engine="unit-scripted")))


def test_a_path_that_names_no_engine_is_a_serve_error():
    with pytest.raises(ServeError, match=r"serve.engine: engine 'json:dumps' names 'json:dumps', which is not a sub"):
        check_engine("json:dumps")
    check_engine("transformers")  # the shipped engine serves through its continuous batcher

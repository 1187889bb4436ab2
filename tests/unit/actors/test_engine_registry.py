"""The engine registry: what the config accepts and keeps, what a lookup finds, and what it refuses (the serve
app's check: tests/unit/serve/test_serve_engines.py)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from agentgym_rl.actors.engines import UnknownEngineError, engine_class, engine_names, register_engine
from agentgym_rl.actors.engines.transformers_engine import TransformersEngine
from agentgym_rl.configs import Config
from tests.integration.scripted_engine import ScriptedEngine


class GreedyEngine(TransformersEngine):
    """A subclass of a shipped engine: it inherits the transformers engine's serving form."""


register_engine("unit-greedy", GreedyEngine)
PATH = f"{__name__}:GreedyEngine"


@pytest.mark.parametrize("section", ["sampler", "serve"])
def test_an_unknown_engine_is_a_config_error_that_lists_the_registered_ones(section):
    with pytest.raises(ValidationError, match=rf"{section}.engine[\s\S]*unknown engine 'nope'; registered engines: "):
        Config.model_validate({section: {"engine": "nope"}})
    assert {"transformers", "vllm", "unit-greedy"} <= set(engine_names())


def test_a_registered_name_is_kept_as_the_path_other_processes_import_and_shipped_names_as_given():
    config = Config.model_validate({"sampler": {"engine": "unit-greedy"}, "serve": {"engine": "unit-greedy"}})
    assert config.sampler.engine == config.serve.engine == PATH
    assert engine_class("unit-greedy") is engine_class(PATH) is GreedyEngine
    assert Config.model_validate({"sampler": {"engine": "vllm"}}).sampler.engine == "vllm"
    assert engine_class("transformers") is TransformersEngine


def local_engine() -> type:
    class Local(ScriptedEngine):
        pass

    return Local


@pytest.mark.parametrize(
    ("name", "engine", "refusal"),
    [
        ("unit-local", local_engine(), "top level of an importable module"),
        ("unit-dict", dict, "not a subclass of actors.engines.Engine"),
        ("transformers", GreedyEngine, "a shipped engine's; register yours under another name"),
    ],
)
def test_register_engine_refuses_what_a_sampler_could_not_import(name, engine, refusal):
    with pytest.raises(UnknownEngineError, match=refusal):
        register_engine(name, engine)
    assert name == "transformers" or name not in engine_names()


@pytest.mark.parametrize(
    ("path", "refusal"),
    [("json:dumps", "not a subclass of actors.engines.Engine"), ("no_such_module:Engine", "cannot be imported")],
)
def test_a_path_that_names_no_engine_is_refused(path, refusal):
    with pytest.raises(UnknownEngineError, match=refusal):
        engine_class(path)

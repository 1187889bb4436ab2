"""Env actions as functions: the schema rules and the default call-to-action checks."""

import pytest
from pydantic import ValidationError

from agentgym_rl.envs import Function, InvalidAction, ToolCall
from agentgym_rl.envs.target_word import TargetWordEnv

MOVE = Function(
    name="move",
    description="Walk some steps.",
    parameters={"type": "object", "properties": {"steps": {"type": "integer", "minimum": 1}}, "required": ["steps"]},
)


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({"steps": 2}, None),
        ({"steps": 0}, "arguments of move at steps: 0 is less than the minimum of 1"),
        ({}, "arguments of move: 'steps' is a required property"),
        ({"steps": "two"}, "arguments of move at steps: 'two' is not of type 'integer'"),
    ],
)
def test_arguments_are_checked_against_the_schema(arguments, error):
    assert MOVE.argument_error(arguments) == error


@pytest.mark.parametrize(
    "parameters", [{"type": "string"}, {"properties": {}}, {"type": "object", "properties": {"a": {"type": "nope"}}}]
)
def test_parameters_must_be_an_object_schema(parameters):
    with pytest.raises(ValidationError, match="parameters"):
        Function(name="f", parameters=parameters)


def test_a_bad_function_name_is_refused():
    with pytest.raises(ValidationError, match="name"):
        Function(name="two words")


def test_calls_compare_by_name_and_parsed_arguments():
    call = ToolCall(id="call_1", name="move", arguments={"steps": 2, "to": "door"})
    assert call.same_call(ToolCall(id="call_9", name="move", arguments={"to": "door", "steps": 2}))
    assert not call.same_call(ToolCall(id="call_1", name="move", arguments={"steps": 3, "to": "door"}))
    assert not call.same_call(ToolCall(id="call_1", name="walk", arguments={"steps": 2, "to": "door"}))
    assert MOVE.openai() == {"type": "function", "function": MOVE.model_dump()}


def test_an_env_without_functions_turns_every_call_into_an_invalid_action():
    env = TargetWordEnv()
    assert not env.has_functions() and env.functions() == []
    outcome = env.action_of_call(ToolCall(id="call_1", name="move", arguments={}))
    assert outcome == InvalidAction(reason="there is no function 'move'; the functions are: none")

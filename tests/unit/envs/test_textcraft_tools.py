"""TextCraft's actions as functions: every oracle action round-trips through its call, and bad calls say why."""

from __future__ import annotations

import pytest

from agentgym_rl.envs.base import InvalidAction
from agentgym_rl.envs.textcraft import TextCraftEnv
from agentgym_rl.envs.tools import ToolCall


@pytest.fixture(scope="module")
def env() -> TextCraftEnv:
    return TextCraftEnv()


def test_oracle_episodes_played_as_calls_round_trip_and_win(env):
    names = set()
    for task in env.tasks("test")[:12]:
        env.reset(task)
        while True:
            action = env.oracle_action()
            call = env.call_of_action(action)
            assert call is not None, action
            assert env.action_of_call(call) == f"Action: {action}"
            assert env.call_of_action(env.action_of_call(call)).same_call(call)
            names.add(call.name)
            result = env.step(env.action_of_call(call))
            if result.done:
                assert result.info["success"], task
                break
    assert names == {"get", "craft"}


@pytest.mark.parametrize(
    ("action", "call"),
    [
        ("inventory", ToolCall(id="call_0", name="inventory")),
        ("get 3 oak logs", ToolCall(id="call_0", name="get", arguments={"item": "oak logs", "count": 3})),
        (
            "craft 4 oak planks using 1 oak logs",
            ToolCall(
                id="call_0",
                name="craft",
                arguments={"target": "oak planks", "count": 4, "ingredients": [{"item": "oak logs", "count": 1}]},
            ),
        ),
        (  # the output count may be left out, in text and in a call
            "craft stick using 1 oak planks, 1 birch planks",
            ToolCall(
                id="call_0",
                name="craft",
                arguments={
                    "target": "stick",
                    "ingredients": [{"item": "oak planks", "count": 1}, {"item": "birch planks", "count": 1}],
                },
            ),
        ),
    ],
)
def test_each_action_form_is_a_call_and_back(env, action, call):
    assert env.call_of_action(f"Thought: go.\nAction: {action}") == call
    assert env.action_of_call(call) == f"Action: {action}"


@pytest.mark.parametrize(
    ("call", "reason"),
    [
        (ToolCall(id="c", name="get", arguments={"item": "oak logs"}), "'count' is a required property"),
        (ToolCall(id="c", name="get", arguments={"item": "oak logs", "count": 0}), "0 is less than the minimum of 1"),
        (ToolCall(id="c", name="get", arguments={"item": "a, b", "count": 1}), "at item: 'a, b' does not match"),
        (ToolCall(id="c", name="craft", arguments={"target": "stick", "ingredients": []}), "should be non-empty"),
        (
            ToolCall(id="c", name="craft", arguments={"target": "stick", "ingredients": [{"item": "oak planks"}]}),
            "at ingredients/0: 'count' is a required property",
        ),
        (ToolCall(id="c", name="smelt", arguments={}), "there is no function 'smelt'; the functions are: get, craft"),
    ],
)
def test_a_bad_call_is_an_invalid_action_that_says_why(env, call, reason):
    outcome = env.action_of_call(call)
    assert isinstance(outcome, InvalidAction) and reason in outcome.reason


def test_text_that_is_no_action_has_no_call(env):
    for text in ("craft planks", "get some logs", "craft 1 stick using planks", "Action: build a house"):
        assert env.call_of_action(text) is None, text

"""BabyAI's actions as functions: every action text round-trips through its call, and bad calls say why."""

from __future__ import annotations

import pytest

from agentgym_rl.envs.babyai import BabyAIEnv
from agentgym_rl.envs.base import InvalidAction
from agentgym_rl.envs.tools import ToolCall

# Levels whose oracle episodes use every kind of action (doors, keys, boxes, goals).
TASKS = [1, 6, 11, 16, 23, 27, 29]


@pytest.fixture(scope="module")
def env() -> BabyAIEnv:
    environment = BabyAIEnv()
    yield environment
    environment.close()


def test_every_oracle_action_and_every_action_on_offer_round_trips_through_its_call(env):
    names = set()
    for task in TASKS:
        env.reset(task)
        while True:
            # Each available action (not only the one the oracle takes) is a call and back.
            for action in env.available_actions:
                call = env.call_of_action(action)
                assert call is not None, action
                assert env.action_of_call(call) == f"Action: {action}"
                assert env.call_of_action(env.action_of_call(call)).same_call(call)
                names.add(call.name)
            oracle = env.oracle_action()
            result = env.step(env.action_of_call(env.call_of_action(oracle)))
            if result.done:
                assert result.info["success"], task
                break
    assert names == {f.name for f in env.functions()}


@pytest.mark.parametrize(
    ("call", "reason"),
    [
        (ToolCall(id="c", name="jump"), "there is no function 'jump'; the functions are: turn_left, turn_right,"),
        (ToolCall(id="c", name="go_to"), "arguments of go_to: 'object' is a required property"),
        (ToolCall(id="c", name="go_to", arguments={"object": "the ball"}), "arguments of go_to at object: 'the ball'"),
        (ToolCall(id="c", name="pickup", arguments={"object": "red door 1"}), "at object: 'red door 1' does not match"),
        (ToolCall(id="c", name="go_through", arguments={"door": 3}), "at door: 3 is not of type 'string'"),
        (ToolCall(id="c", name="turn_left", arguments={"steps": 2}), "Additional properties are not allowed"),
    ],
)
def test_a_bad_call_is_an_invalid_action_that_says_why(env, call, reason):
    outcome = env.action_of_call(call)
    assert isinstance(outcome, InvalidAction) and reason in outcome.reason


def test_text_that_is_no_action_has_no_call(env):
    assert env.call_of_action("go to the red ball") is None
    assert env.call_of_action("Thought: I will dance.\nAction: dance") is None
    assert env.call_of_action("Thought: ahead.\nAction: Go To Red Ball 1.").arguments == {"object": "red ball 1"}


def test_a_call_for_an_object_out_of_sight_reaches_the_env_and_is_refused_there(env):
    env.reset(1)
    result = env.step(env.action_of_call(ToolCall(id="c", name="pickup", arguments={"object": "purple key 9"})))
    assert not result.info["action_valid"] and result.observation.startswith("The action is not recognized.")

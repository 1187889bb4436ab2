"""Deep Search's actions as functions: every oracle reply round-trips through its call, and bad calls say why."""

from __future__ import annotations

import pytest

from agentgym_rl.envs.base import InvalidAction
from agentgym_rl.envs.search import SearchEnv
from agentgym_rl.envs.tools import ToolCall


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> SearchEnv:
    return SearchEnv(cache_dir=tmp_path_factory.mktemp("search-cache"))


def test_oracle_episodes_played_as_calls_round_trip_and_win(env):
    for task in env.tasks("test")[:8]:
        env.reset(task)
        names = []
        while True:
            reply = env.oracle_action()
            call = env.call_of_action(reply)
            assert env.action_of_call(call) == reply
            names.append(call.name)
            result = env.step(env.action_of_call(call))
            if result.done:
                assert result.info["success"], task
                break
        assert names[-1] == "answer" and set(names[:-1]) == {"search"}


@pytest.mark.parametrize(
    ("reply", "call"),
    [
        (
            "Let me look.\n<search>capital of  Norway</search>",
            ToolCall(id="call_0", name="search", arguments={"query": "capital of Norway"}),
        ),
        ("<ANSWER>Oslo</ANSWER>", ToolCall(id="call_0", name="answer", arguments={"text": "Oslo"})),
    ],
)
def test_a_reply_is_the_call_of_its_first_tag(env, reply, call):
    assert env.call_of_action(reply) == call


@pytest.mark.parametrize(
    ("call", "reason"),
    [
        (ToolCall(id="c", name="search", arguments={}), "arguments of search: 'query' is a required property"),
        (ToolCall(id="c", name="search", arguments={"query": "   "}), "at query: '   ' does not match"),
        (ToolCall(id="c", name="answer", arguments={"text": "x" * 1001}), "is too long"),
        (ToolCall(id="c", name="answer", arguments={"answer": "Oslo"}), "'text' is a required property"),
        (
            ToolCall(id="c", name="lookup", arguments={}),
            "there is no function 'lookup'; the functions are: search, answer",
        ),
    ],
)
def test_a_bad_call_is_an_invalid_action_that_says_why(env, call, reason):
    outcome = env.action_of_call(call)
    assert isinstance(outcome, InvalidAction) and reason in outcome.reason


def test_text_without_a_tag_has_no_call(env):
    assert env.call_of_action("I think it is Oslo.") is None
    assert env.call_of_action("<search></search>") is None

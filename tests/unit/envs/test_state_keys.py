"""The ``state_key`` hook (GiGPO's anchor states): equal states give equal digests across env instances, a
state change changes the key, and the env host stamps the digest on every reset and step."""

from __future__ import annotations

import shutil
from collections.abc import Sequence

import pytest

from agentgym_rl.envs.actor import EnvHost
from agentgym_rl.envs.babyai import BabyAIEnv
from agentgym_rl.envs.base import InvalidAction, Observation, StepResult, TextEnv, state_digest
from agentgym_rl.envs.sciworld import SciWorldEnv
from agentgym_rl.envs.search import SearchEnv
from agentgym_rl.envs.target_word import TargetWordEnv
from agentgym_rl.envs.textcraft import TextCraftEnv
from agentgym_rl.envs.web import WebEnv


class Plain(TextEnv):
    """An env without the hook: one turn, always done."""

    name = "plain"

    @property
    def instruction(self) -> str:
        return "say anything"

    def tasks(self, split: str) -> Sequence[int]:
        return [0]

    def reset(self, task_id: int) -> Observation:
        return Observation(text="go")

    def step(self, action_text: str) -> StepResult:
        return StepResult(observation="ok", reward=0.0, done=False)

    def parse_action(self, model_text: str) -> str | InvalidAction:
        return model_text


def test_the_hook_defaults_to_none_and_the_host_stamps_its_digest():
    assert not Plain.has_state_key()
    assert all(cls.has_state_key() for cls in (BabyAIEnv, TextCraftEnv, SciWorldEnv, WebEnv, TargetWordEnv, SearchEnv))
    plain = EnvHost(f"{__name__}:Plain")
    assert plain.reset(0).state_key is None and plain.step("x").state_key is None
    assert state_digest(None) is None
    assert state_digest(("a", 1, b"\x00")) == state_digest(("a", 1, b"\x00")) != state_digest(("a", 2, b"\x00"))


def test_babyai_keys_follow_the_agents_pose_and_view():
    first, second = EnvHost("babyai", {"levels": ["GoToRedBall"]}), EnvHost("babyai", {"levels": ["GoToRedBall"]})
    task = first.tasks("train")[0]
    start = first.reset(task).state_key
    assert start is not None and second.reset(task).state_key == start  # another instance, same state
    keys = [first.step("Action: turn left").state_key for _ in range(4)]
    assert keys[0] != start and keys[-1] == start  # four left turns face the same way again
    assert first.step("Action: no such action").state_key == start  # an invalid action changes nothing


def test_textcraft_key_is_the_inventory():
    host = EnvHost("textcraft")
    env: TextCraftEnv = host.env
    task = env.tasks("test")[0]
    start = host.reset(task).state_key
    assert start == state_digest(())
    get = next(action for action in env.oracle_actions(task) if action.startswith("get"))
    host.reset(task)
    after = host.step(f"Action: {get}").state_key
    assert after == state_digest(env.state_key()) != start
    assert host.step("Action: inventory").state_key == after


def test_search_key_is_the_passages_read():
    first, second = EnvHost("search"), EnvHost("search")
    env: SearchEnv = first.env
    task = env.tasks("test")[0]
    *searches, answer = env.oracle_actions(task)
    start = first.reset(task).state_key
    assert start == state_digest(()) == second.reset(task).state_key
    after = first.step(searches[0]).state_key
    assert after != start and after == second.step(searches[0]).state_key  # another instance, same passages read
    assert first.step(searches[0]).state_key == after  # the same search again reads nothing new
    assert first.step("no tag at all").state_key == after  # an invalid action changes nothing
    assert first.step(searches[1]).state_key not in (start, after)
    assert first.step(answer).state_key is None  # the episode is over: no turn acts from there


def test_target_word_key_is_the_turn():
    host = EnvHost("target-word", {"turns": 3})
    assert host.reset(70).state_key == state_digest(0)
    assert host.step("Action: apple").state_key == state_digest(1)
    assert host.step("Action: apple").state_key == state_digest(2)
    assert host.step("Action: apple").state_key is None  # the episode is over: no turn acts from there


def test_sciworld_keys_repeat_for_the_same_state_and_change_with_it():
    host = EnvHost("sciworld")
    try:
        env: SciWorldEnv = host.env
        task = env.tasks("test")[0]
        gold = env.oracle_actions(task)
        start = host.reset(task).state_key
        assert start is not None and host.reset(task).state_key == start
        assert host.step("Action: look around").state_key == start  # looking changes nothing
        keys = {start}
        for action in gold[:5]:
            result = host.step(f"Action: {action}")
            if result.done:
                break
            keys.add(result.state_key)
        assert len(keys) > 1
    finally:
        host.close()


@pytest.mark.skipif(
    shutil.which("chromium") is None and shutil.which("chromium-browser") is None, reason="no system Chromium"
)
def test_web_keys_repeat_for_the_same_page_and_change_with_it():
    host = EnvHost("web", {"action_timeout": 3.0})
    try:
        env: WebEnv = host.env
        task = env.tasks("test")[0]
        start = host.reset(task).state_key
        assert start is not None and host.reset(task).state_key == start
        assert host.step(f"```{env.oracle_action()}```").state_key != start
    finally:
        host.close()

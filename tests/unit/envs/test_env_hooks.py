"""The env-specific facts that ``TextEnv`` hooks carry (task categories, scores, oracles, frames), and the rule
they enforce: code outside ``envs/`` asks an env through its hooks and never switches on its name."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from pydantic import ValidationError

from agentgym_rl import envs
from agentgym_rl.envs import EnvError, TextEnv
from agentgym_rl.envs.actor import EnvHost
from agentgym_rl.envs.babyai import LEVELS, BabyAIEnv
from agentgym_rl.envs.textcraft import goals
from tests.unit.envs.test_state_keys import Plain

ROOT = Path(__file__).parents[3]
OUTSIDE_ENVS = ("actors", "driver", "learner", "serve")
HAS_ORACLE = {"babyai", "sciworld", "search", "target-word", "textcraft", "web"}
HAS_FRAMES = {"babyai"}


def made(name: str) -> TextEnv:
    """``make(name)`` with default options, or a skip for envs that cannot be made so here."""
    try:
        return envs.make(name)
    except (EnvError, ValidationError):  # the remote clients need a server address
        pytest.skip(f"env {name!r} needs options")


def test_every_env_declares_whether_it_has_an_oracle_and_frames():
    shipped = [name for name in envs.names() if not name.startswith("test-")]  # other tests register test- envs
    assert {name for name in shipped if envs.env_class(name).has_oracle()} == HAS_ORACLE
    assert {name for name in shipped if envs.env_class(name).has_frames()} == HAS_FRAMES


@pytest.mark.parametrize("name", envs.names())
def test_every_env_that_can_be_made_answers_the_hooks(name: str):
    env = made(name)
    try:
        for task_id in list(env.tasks("test"))[:3]:
            category = env.task_category(task_id)
            assert isinstance(category, str) and category
        assert isinstance(env.episode_score(1.0), float)
        assert isinstance(env.replay_options({}), dict)
    finally:
        env.close()


def test_categories_of_babyai_are_its_levels():
    env = BabyAIEnv(oracle=False)
    # Task id i plays level LEVELS[i % 40].
    assert [env.task_category(task_id) for task_id in (0, 1, 39, 40, 41, 77)] == [
        "GoToRedBallGrey",
        "GoToRedBall",
        "BossLevelNoUnlock",
        "GoToRedBallGrey",
        "GoToRedBall",
        "MiniBossLevel",
    ]
    assert [env.task_category(task_id) for task_id in range(80)] == [LEVELS[i % len(LEVELS)] for i in range(80)]


def test_categories_of_textcraft_are_crafting_depths():
    env = envs.make("textcraft")
    depth = {goal: env.task_category(goals().index(goal)) for goal in goals()}
    assert depth["minecraft:oak_planks"] == "depth 1"  # planks from logs
    assert depth["minecraft:stick"] == "depth 1"  # sticks from planks of any kind: the shallowest recipe
    assert depth["minecraft:wooden_pickaxe"] == "depth 2"  # planks and sticks
    assert depth["minecraft:crafting_table"] == "depth 2"
    assert depth["minecraft:cyan_banner"] == "depth 4"
    counts = {level: list(depth.values()).count(level) for level in set(depth.values())}
    assert counts == {"depth 1": 125, "depth 2": 291, "depth 3": 117, "depth 4": 11}
    with pytest.raises(EnvError, match="out of range"):
        env.task_category(len(goals()))


def test_categories_of_search_are_hop_counts():
    env = envs.make("search")
    assert [env.task_category(task_id) for task_id in range(3)] == [
        f"{len(env.questions[task_id].hops)} hops" for task_id in range(3)
    ]


def test_categories_of_sciworld_are_task_names():
    if shutil.which("java") is None:
        pytest.skip("SciWorld needs a java binary")
    env = envs.make("sciworld")
    try:
        assert env.task_category(0) == "boil"  # ids 0-29 are boil (REFERENCE.md)
        assert env.task_category(30) == "melt"
        assert env.episode_score(0.25 + 0.5) == pytest.approx(75.0)  # score changes / 100, back on 0-100
        assert env.episode_score(0.3 - 1.3) == 0.0  # simulator score -100: failed
    finally:
        env.close()


def test_the_defaults_are_one_category_the_reward_as_score_no_oracle_and_no_frames():
    assert not Plain.has_oracle() and not Plain.has_frames()
    env = Plain()
    assert env.task_category(0) == "all"
    assert env.episode_score(0.5) == 0.5
    assert env.replay_options({"seed": 1}) == {"seed": 1}
    with pytest.raises(EnvError, match="'plain' has no frames"):
        env.render_frame()
    with pytest.raises(EnvError, match="'plain' has no oracle"):
        env.oracle_action()


def test_the_host_replies_with_the_oracle_of_an_env_that_has_one():
    host = EnvHost("target-word")
    host.reset(0)
    assert host.env.parse_action(host.oracle_reply()) == host.env.oracle_action()
    plain = EnvHost("tests.unit.envs.test_state_keys:Plain")
    plain.reset(0)
    with pytest.raises(EnvError, match="'plain' has no oracle; sampler.policy=oracle needs one"):
        plain.oracle_reply()


def test_babyai_replays_keep_the_run_options_but_skip_the_oracle():
    options = BabyAIEnv.replay_options({"levels": ["GoToRedBallGrey"]})
    assert options == {"levels": ["GoToRedBallGrey"], "oracle": False}
    env = BabyAIEnv(**options)
    try:
        env.reset(0)
        assert env.render_frame().shape[2] == 3
    finally:
        env.close()


def env_modules() -> set[str]:
    """The modules that define a registered env, and the package of an env defined in its ``env`` module."""
    modules = {envs.env_class(name).__module__ for name in envs.names()}
    return modules | {module.removesuffix(".env") for module in modules if module.endswith(".env")}


def name_switches(source: str) -> list[str]:
    """Comparisons with, ``case`` patterns on and imports of a registered env (name or module) in ``source``."""
    quoted = rf"[\"'](?:{'|'.join(re.escape(name) for name in envs.names())})[\"']"
    modules = "|".join(re.escape(module) for module in sorted(env_modules()))
    pattern = re.compile(
        rf"(?:==|!=)\s*{quoted}|{quoted}\s*(?:==|!=)|\bcase\s+{quoted}"
        rf"|^\s*(?:from|import)\s+(?:{modules})\b(?!\.)",
        re.MULTILINE,
    )
    return [match.group(0).strip() for match in pattern.finditer(source)]


def test_the_switch_finder_catches_comparisons_and_imports():
    assert name_switches('if env.name == "babyai":\n    pass') == ['== "babyai"']
    assert name_switches("if 'textcraft' != name:") == ["'textcraft' !="]
    assert name_switches("from agentgym_rl.envs.textcraft import goals") == ["from agentgym_rl.envs.textcraft"]
    assert name_switches("    from agentgym_rl.envs.babyai import BabyAIEnv") == ["from agentgym_rl.envs.babyai"]
    assert name_switches("from agentgym_rl.envs.search import SearchEnv") == ["from agentgym_rl.envs.search"]
    assert name_switches("from agentgym_rl.envs.base import TextEnv\nfrom agentgym_rl.envs import make") == []
    assert name_switches('name: str = "babyai"') == []


def test_no_code_outside_envs_switches_on_an_env_name():
    found = {
        str(path.relative_to(ROOT)): switches
        for folder in OUTSIDE_ENVS
        for path in sorted((ROOT / folder).rglob("*.py"))
        if (switches := name_switches(path.read_text()))
    }
    assert found == {}, "ask the env through a TextEnv hook (envs/base.py) instead of naming it"

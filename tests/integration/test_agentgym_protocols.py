"""The env server driven as AgentGym's own clients (``agentenv.envs.*``) drive it, one env each.

Every request here has the body AgentGym's client of that env sends (its ``_post`` adds the env's
id to the body last, so ids come after the payload), and every assertion reads the fields that client
reads: BabyAI's reads ``observation, reward, score, done``; TextCraft's builds its first observation
from ``/create``; SciWorld's joins ``task_description`` and ``observation`` and uses ``score`` (0-100)
as the reward; SearchQA's creates with ``{"id": 0}`` and reads a bare ``env_idx``; WebArena's reads
``env_idx`` and ``terminated``. Each test also sends ids as strings and bodies with fields the server
does not know (AgentGym's FastAPI models accept both) and closes twice.
Then this project's client (``AgentGymClient``) speaks each shape against the same servers.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator

import httpx
import pytest

from agentgym_rl.envs.babyai import BabyAIEnv
from agentgym_rl.envs.base import EnvError
from agentgym_rl.envs.http import AgentGymClient, build_app
from agentgym_rl.envs.search.env import SearchEnv
from agentgym_rl.envs.textcraft import TextCraftEnv
from tests.integration.http_server import serve


@contextlib.contextmanager
def client_for(name: str, options: dict | None = None, **server) -> Iterator[httpx.Client]:
    """An HTTP client of a fresh ``env-server`` app for env ``name`` on 127.0.0.1."""
    with serve(build_app(name, options, max_envs=4, **server)) as url, httpx.Client(base_url=url, timeout=120) as http:
        yield http


def ok(response: httpx.Response):
    """AgentGym's clients assert status 200 and read the JSON."""
    assert response.status_code == 200, response.text
    return response.json()


# ------------------------------------------------------------------------------------------- BabyAI

LEVELS = {"levels": ["GoToRedBall"]}


@pytest.fixture(scope="module")
def babyai() -> Iterator[httpx.Client]:
    with client_for("babyai", LEVELS) as http:
        yield http


def test_babyai_as_agentgyms_client_drives_it(babyai):
    env_id = ok(babyai.post("/create"))["id"]
    assert isinstance(env_id, int)
    reset = ok(babyai.post("/reset", json={"data_idx": 1, "id": env_id}))
    assert {"observation", "reward", "score", "done", "deleted"} <= set(reset)
    assert (
        reset["observation"].startswith("Your goal: go to the red ball")
        and "Available actions: [" in reset["observation"]
    )
    assert (reset["reward"], reset["score"], reset["done"], reset["deleted"]) == (0, 0, False, False)
    steps = []
    for action in BabyAIEnv(**LEVELS).oracle_episode(1):
        # A string id and a field the server does not define, both accepted as by AgentGym's server.
        steps.append(ok(babyai.post("/step", json={"action": action, "id": str(env_id), "thought": "..."})))
    assert all({"observation", "reward", "score", "done"} <= set(step) for step in steps)
    assert steps[-1]["done"] and 0 < steps[-1]["reward"] <= 1
    assert steps[-1]["score"] == pytest.approx(sum(step["reward"] for step in steps))  # running sum, 0-1 scale
    current = ok(babyai.get("/observation", params={"id": str(env_id)}))
    assert current == {
        "observation": steps[-1]["observation"],
        "reward": steps[-1]["reward"],
        "score": steps[-1]["score"],
        "done": True,
        "deleted": False,
    }
    assert ok(babyai.post("/close", json={"id": env_id})) is True
    assert ok(babyai.post("/close", json={"id": env_id})) is False  # AgentGym's BabyAI server answers so too


def test_truly_bad_input_still_gets_4xx_json(babyai):
    env_id = ok(babyai.post("/create"))["id"]
    cases = [
        (babyai.post("/reset", json={"id": env_id, "data_idx": -1}), 404, "non-negative"),
        (babyai.post("/reset", json={"id": "zero", "data_idx": 1}), 422, "id"),
        (babyai.post("/reset", json={"id": env_id, "data_idx": "1.5"}), 422, "data_idx"),
        (
            babyai.post("/step", content=b'{"id": 0, "action": ', headers={"content-type": "application/json"}),
            400,
            "not JSON",
        ),
        (babyai.post("/reset", json={"id": 99_999, "data_idx": 1}), 404, "unknown env id 99999"),
        (babyai.post("/close", json={"id": 99_999}), 404, "unknown env id 99999"),
    ]
    for response, status, words in cases:
        assert response.status_code == status, response.text
        assert words in response.json()["error"]
    ok(babyai.post("/close", json={"id": env_id}))


# ---------------------------------------------------------------------------------------- TextCraft


@pytest.fixture(scope="module")
def textcraft() -> Iterator[httpx.Client]:
    with client_for("textcraft") as http:
        yield http


def test_textcraft_as_agentgyms_client_drives_it(textcraft):
    local = TextCraftEnv()
    # The client's constructor: /create with its directory and optional commands/goal; reads id and observation.
    created = ok(
        textcraft.post("/create", json={"minecraft_dir": "agentenv_textcraft/", "commands": None, "goal": None})
    )
    env_id = created["id"]
    # Already reset to task `data_idx = id`, as AgentGym's TextCraft server does.
    assert created["observation"] == local.reset(env_id).text
    assert (created["done"], created["reward"]) == (False, 0)
    reset = ok(textcraft.post("/reset", json={"data_idx": 7, "id": str(env_id), "unknown": [1]}))
    assert reset["id"] == env_id and reset["observation"] == local.reset(7).text
    assert (reset["done"], reset["reward"]) == (False, 0)
    assert ok(textcraft.get("/goal", params={"id": env_id})) == local.goal
    assert ok(textcraft.get("/commands", params={"id": env_id})) == local.commands
    for action in local.oracle_actions(7):
        step = ok(textcraft.post("/step", json={"action": action, "id": env_id}))
        assert set(step) >= {"observation", "reward", "done"}
    assert step["done"] and step["reward"] == 1  # 0/1 scale
    assert ok(textcraft.get("/observation", params={"id": env_id})) == step["observation"]
    assert ok(textcraft.post("/close", json={"id": env_id})) is True
    assert ok(textcraft.post("/close", json={"id": env_id})) is False
    local.close()


def test_textcraft_create_plays_the_callers_commands_and_goal(textcraft):
    listing = "craft 4 oak planks using 1 oak logs"
    created = ok(textcraft.post("/create", json={"commands": listing, "goal": "minecraft:oak_planks"}))
    assert created["observation"] == f"Crafting commands:\n{listing}\n\nGoal: craft oak planks."
    env_id = created["id"]
    assert ok(textcraft.get("/goal", params={"id": env_id})) == "oak planks"
    ok(textcraft.post("/step", json={"action": "get 1 oak logs", "id": env_id}))
    last = ok(textcraft.post("/step", json={"action": "craft 4 oak planks using 1 oak logs", "id": env_id}))
    assert last["done"] and last["reward"] == 1
    ok(textcraft.post("/close", json={"id": env_id}))
    half = textcraft.post("/create", json={"goal": "minecraft:oak_planks"})
    assert half.status_code == 422 and "both `commands` and `goal`" in half.json()["error"]
    unknown = textcraft.post("/create", json={"commands": listing, "goal": "minecraft:unobtainium"})
    assert unknown.status_code == 404 and "no craftable item" in unknown.json()["error"]
    live = ok(textcraft.get("/"))["live_envs"]
    assert live == 0, "a refused /create must free the env it made"


# ----------------------------------------------------------------------------------------- SciWorld


@pytest.mark.skipif(shutil.which("java") is None, reason="SciWorld needs a Java runtime")
def test_sciworld_as_agentgyms_client_drives_it():
    from agentgym_rl.envs.sciworld import SciWorldEnv

    local = SciWorldEnv()
    gold = local.oracle_actions(0)
    first = local.reset(0).text
    local.close()
    with client_for("sciworld") as http:
        env_id = ok(http.post("/create"))["id"]
        reset = ok(http.post("/reset", json={"data_idx": "0", "id": env_id, "extra": True}))
        assert (reset["task_name"], reset["var_num"]) == ("boil", 0)
        assert reset["task_description"].startswith("Your task is to boil water")
        # What AgentGym's client shows the model: the description, a newline, the observation.
        assert reset["task_description"] + "\n" + reset["observation"] == first
        assert (reset["score"], reset["done"], reset["deleted"]) == (0, False, False)
        assert ok(http.get("/observation", params={"id": str(env_id)})) == reset["observation"]
        scores = []
        for action in gold:
            step = ok(http.post("/step", json={"action": action, "id": str(env_id)}))
            scores.append(step["score"])  # AgentGym's client returns `score` as the step's reward
            if step["done"]:
                break
        assert step["done"] and scores[-1] == 100  # the simulator's 0-100 scale
        assert scores == sorted(scores) and any(0 < score < 100 for score in scores)
        assert ok(http.get("/observation", params={"id": env_id})) == step["observation"]
        assert ok(http.post("/close", json={"id": env_id})) is True
        # AgentGym's SciWorld server fails a second close with a 500; this server answers as BabyAI's does.
        assert ok(http.post("/close", json={"id": env_id})) is False


# --------------------------------------------------------------------------------------- SearchQA


def test_searchqa_as_agentgyms_client_drives_it():
    local = SearchEnv()
    replies = local.oracle_actions(3)
    first = local.reset(3).text
    local.close()
    with client_for("search") as http:
        env_idx = ok(http.post("/create", json={"id": 0}))  # a bare int
        assert isinstance(env_idx, int)
        assert ok(http.post("/reset", json={"id": 3, "env_idx": str(env_idx)})) == first
        assert ok(http.get("/observation", params={"env_idx": env_idx})) == first
        for reply in replies:
            step = ok(http.post("/step", json={"action": reply, "env_idx": env_idx, "noise": 1}))
            assert set(step) >= {"observation", "reward", "done"}
        assert step["done"] and step["reward"] == 1.0  # exact match, 0/1 scale
        assert ok(http.post("/close", json={"env_idx": env_idx})) is True
        assert ok(http.post("/close", json={"env_idx": env_idx})) is False  # as AgentGym's SearchQA server


# --------------------------------------------------------------------------------------- WebArena


@pytest.mark.skipif(
    shutil.which("chromium") is None and shutil.which("chromium-browser") is None,
    reason="no system Chromium: install the OS package (./install.sh does, as root)",
)
def test_webarena_as_agentgyms_client_drives_it():
    from agentgym_rl.envs.web import WebEnv
    from agentgym_rl.envs.web.tasks import TASKS

    local = WebEnv()
    plan = local.oracle_episode(35)
    local.close()
    with client_for("web") as http:
        env_idx = ok(http.post("/create"))["env_idx"]
        reset = ok(http.post("/reset", json={"seed": 0, "idx": "35", "env_idx": env_idx, "options": {}}))
        assert reset["observation"] != "TimeoutError" and reset["object"] == TASKS[35].intent
        assert reset["sites"] == ["shop"]
        prompt = ok(http.get("/observation", params={"env_idx": str(env_idx)}))
        assert prompt.startswith("OBSERVATION:\n") and f"OBJECTIVE: {TASKS[35].intent}" in prompt
        for action in plan:
            step = ok(http.post("/step", json={"action": f"Let me act. ```{action}```", "env_idx": str(env_idx)}))
            assert set(step) >= {"observation", "reward", "terminated", "truncated", "info"}
        assert step["terminated"] and step["reward"] == 1.0  # 0/1 scale, read once terminated
        assert ok(http.post("/close", json={"env_idx": env_idx})) == {"closed": "closed"}
        assert ok(http.post("/close", json={"env_idx": env_idx})) == {"closed": "closed"}


# ------------------------------------------------------------------ this project's client, every shape


def test_our_generic_client_speaks_the_textcraft_shape(textcraft):
    # env_name unset: the client knows nothing of the env (as for an AgentGym env this project lacks);
    # it sends bare actions parsed from `Action:` lines, with the protocol named.
    url = str(textcraft.base_url)
    client = AgentGymClient(base_url=url, protocol="textcraft", splits={"test": [7]})
    local = TextCraftEnv()
    assert client.reset(7).text == local.reset(7).text
    for action in local.oracle_actions(7):
        result = client.step(f"Thought: next.\nAction: {action}")
    assert result.done and result.reward == 1.0
    client.close()
    local.close()


@pytest.mark.parametrize("protocol", ["sciworld", "searchqa", "webarena"])
def test_our_client_names_the_protocol_when_a_server_answers_in_another_shape(babyai, protocol):
    client = AgentGymClient(base_url=str(babyai.base_url), protocol=protocol, env_name="babyai", env_options=LEVELS)
    with pytest.raises(EnvError, match=f"AgentGym's {protocol} protocol; set the `protocol` option"):
        client.reset(1)
    client.close()

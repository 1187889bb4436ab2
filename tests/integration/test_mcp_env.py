"""Env `mcp` against a stdio MCP server written with the `mcp` SDK (tests/integration/mcp_server.py): its tools
offered and called, a tool error read by the agent, a killed server restarted, bad options refused, episodes
played by a real sampler (a server that dies is a failed episode, the next one works) and `agentgym-rl train`."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pydantic
import pytest
import ray

from agentgym_rl.actors.sampler import EpisodeRequest, SamplerActor, start_collect
from agentgym_rl.configs import load_config
from agentgym_rl.envs import EnvError, EnvUnavailable, ToolCall, make
from agentgym_rl.envs.mcp.env import ToolResult
from tests.e2e.helpers import run_cli
from tests.factories import RECIPE
from tests.integration.scripted_engine import ScriptedEngine

SERVER = Path(__file__).with_name("mcp_server.py")
TASKS = [
    {"prompt": "What is 2 + 3?", "target": 5, "split": "train"},
    {"prompt": "What is 10 / 4?", "target": 2.5, "split": "train"},
    {"prompt": "What is 7 + 8?", "target": 15, "split": "test"},
]
SCORED: list[dict] = []  # what `reward` was called with, in this process


def reward(*, task: dict, messages: list[dict], tool_results: list[ToolResult], answer: str | None):
    """1 for the task's target as the answer; success also needs a tool call that did not fail."""
    SCORED.append({"task": task, "messages": messages, "tool_results": tool_results, "answer": answer})
    right = answer is not None and float(answer) == task["target"]
    return float(right), right and any(not result.is_error for result in tool_results)


class CrashingEngine(ScriptedEngine):
    """Calls the test server's `crash` tool every turn."""

    REPLY = "Action: crash {}"


class AddingEngine(ScriptedEngine):
    """Calls `add` every turn, as a tool-calling model writes a call (hermes)."""

    REPLY = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'


def server_options(tmp_path: Path, **options) -> dict:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(task) + "\n" for task in TASKS))
    return {
        "command": sys.executable,
        "args": [str(SERVER)],
        "env": {"MCP_TEST_DIR": str(tmp_path)},
        "tasks": str(tasks),
        "reward": "tests.integration.test_mcp_env:reward",
        **options,
    }


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    env = make("mcp", server_options(tmp_path_factory.mktemp("mcp"), reset_tool="forget"))
    yield env
    env.close()


def test_the_servers_tools_are_the_envs_functions_and_its_instruction(env):
    names = [function.name for function in env.functions()]
    assert names == ["add", "divide", "remember", "recall", "crash", "answer"]  # `forget` resets, never offered
    add = env.functions()[0]
    assert add.description == "Add two numbers." and add.parameters["required"] == ["a", "b"]
    assert "- add(a: number, b: number): Add two numbers." in env.instruction
    assert "Action: <tool name>" in env.instruction and "forget" not in env.instruction
    assert list(env.tasks("train")) == [0, 1] and list(env.tasks("test")) == [2]


def test_calls_in_either_form_reach_the_server_and_the_answer_is_scored(env):
    SCORED.clear()
    assert env.reset(0).text == "What is 2 + 3?"
    assert env.step('I add them.\nAction: add {"a": 2, "b": 3}').observation == "5.0"
    step = env.step('<tool_call>{"name": "remember", "arguments": {"key": "sum", "value": 5}}</tool_call>')
    assert step.observation == "stored sum"
    text = env.action_of_call(ToolCall(id="call_1", name="recall", arguments={"key": "sum"}))
    assert text == 'Action: recall {"key": "sum"}'
    assert env.call_of_action(text).same_call(ToolCall(id="x", name="recall", arguments={"key": "sum"}))
    assert env.step(text).observation == "5.0"
    final = env.step("Action: answer 5")
    assert (final.done, final.reward, final.info["success"]) == (True, 1.0, True)
    [scored] = SCORED
    assert scored["answer"] == "5" and scored["task"]["target"] == 5
    assert [(r.name, r.text, r.is_error) for r in scored["tool_results"]] == [
        ("add", "5.0", False),
        ("remember", "stored sum", False),
        ("recall", "5.0", False),
    ]
    assert [m["role"] for m in scored["messages"]] == ["user"] + ["assistant", "user"] * 4
    assert scored["messages"][2] == {"role": "user", "content": "5.0"}
    # reset_tool cleared the memory: the next episode starts alike
    env.reset(1)
    assert "Error" in env.step('Action: recall {"key": "sum"}').observation


def test_a_tool_error_reaches_the_agent_as_text_and_the_episode_goes_on(env):
    SCORED.clear()
    env.reset(1)
    step = env.step('Action: divide {"a": 1, "b": 0}')
    assert not step.done and step.info["tool_error"]
    assert "division by zero" in step.observation
    assert env.step('Action: divide {"a": 10, "b": 4}').observation == "2.5"
    assert env.step('Action: answer {"answer": "2.5"}').reward == 1.0
    assert [r.is_error for r in SCORED[0]["tool_results"]] == [True, False]


@pytest.mark.parametrize(
    ("reply", "says"),
    [
        ("I think it is 5.", "No tool call found"),
        ('Action: multiply {"a": 1}', "There is no tool 'multiply'. The tools are: add, divide"),
        ('Action: add {"a": 1}', "'b' is a required property"),
        ('Action: add {"a": "one", "b": 2}', "'one' is not of type 'number'"),
        ("Action: add a=1 b=2", "must be a JSON object"),
        ('<tool_call>{"name": "add", "arguments": [1, 2]}</tool_call>', "the arguments an object"),
    ],
)
def test_a_reply_without_a_valid_call_is_told_why_and_calls_nothing(env, reply, says):
    env.reset(0)
    step = env.step(reply)
    assert says in step.observation
    assert not step.done and not step.info["action_valid"] and step.reward == 0.0


def test_the_episode_ends_after_max_turns_and_is_scored_without_an_answer(tmp_path):
    SCORED.clear()
    env = make("mcp", server_options(tmp_path, max_turns=2))
    try:
        env.reset(0)
        assert not env.step('Action: add {"a": 2, "b": 3}').done
        last = env.step('Action: add {"a": 2, "b": 3}')
        assert last.done and last.reward == 0.0 and last.info["success"] is False
        assert SCORED[0]["answer"] is None and len(SCORED[0]["tool_results"]) == 2
        with pytest.raises(EnvError, match="call reset"):
            env.step('Action: add {"a": 2, "b": 3}')
    finally:
        env.close()


def test_a_server_tool_as_answer_tool_is_called_and_ends_the_episode(tmp_path):
    SCORED.clear()
    env = make("mcp", server_options(tmp_path, answer_tool="add"))
    try:
        assert [f.name for f in env.functions()][-1] == "crash"  # no function of the env's own
        assert "Calling add ends the task." in env.instruction
        env.reset(0)
        last = env.step('Action: add {"a": 2, "b": 3}')
        assert last.done and last.observation == "5.0"
        assert SCORED[0]["answer"] is None and [r.name for r in SCORED[0]["tool_results"]] == ["add"]
    finally:
        env.close()


def servers(folder: Path) -> set[int]:
    return {int(path.stem) for path in folder.glob("*.pid")}


def test_a_killed_server_fails_the_step_and_the_next_reset_starts_a_new_one(tmp_path):
    env = make("mcp", server_options(tmp_path))
    try:
        env.reset(0)
        [first] = servers(tmp_path)
        os.kill(first, signal.SIGKILL)
        with pytest.raises(EnvUnavailable, match=rf"MCP server `{sys.executable} .*mcp_server.py`") as failure:
            env.step('Action: add {"a": 2, "b": 3}')
        assert "Connection closed" in str(failure.value) or "failed to call tool 'add'" in str(failure.value)

        observation = env.reset(0)  # a new server and session
        assert observation.info["server_restarts"] == 1 and len(servers(tmp_path)) == 2
        assert env.step('Action: add {"a": 2, "b": 3}').observation == "5.0"

        # a server that dies between episodes is found out by the reset's ping and replaced too
        [second] = servers(tmp_path) - {first}
        os.kill(second, signal.SIGKILL)
        time.sleep(0.2)  # let the pipe close; the ping then fails at once (no timing is asserted)
        assert env.reset(1).info["server_restarts"] == 2
        assert env.step('Action: divide {"a": 10, "b": 4}').observation == "2.5"
    finally:
        env.close()


@pytest.fixture
def http_server(tmp_path):
    """The test server on streamable HTTP at a free port: (its URL, its process)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen([sys.executable, str(SERVER), "--http", str(port)], stderr=subprocess.DEVNULL)
    while True:  # until it listens (the test's timeout bounds a server that never does)
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert process.poll() is None, "the HTTP MCP server exited"
            time.sleep(0.1)
    yield f"http://127.0.0.1:{port}/mcp", process
    process.kill()
    process.wait()


def test_a_streamable_http_server_by_url_and_its_death_named_by_url(tmp_path, http_server):
    url, process = http_server
    options = {key: value for key, value in server_options(tmp_path).items() if key not in ("command", "args", "env")}
    env = make("mcp", {**options, "url": url})
    try:
        env.reset(0)
        assert env.step('Action: add {"a": 2, "b": 3}').observation == "5.0"
        assert "division by zero" in env.step('Action: divide {"a": 1, "b": 0}').observation
        process.kill()
        process.wait()
        with pytest.raises(EnvUnavailable, match=f"MCP server {url} "):
            env.step('Action: add {"a": 2, "b": 3}')
        with pytest.raises(EnvUnavailable, match=f"MCP server {url} did not start: ConnectError"):
            env.reset(0)
    finally:
        env.close()


def test_bad_options_get_clear_errors(tmp_path):
    good = server_options(tmp_path)
    with pytest.raises(pydantic.ValidationError, match="sets both of `command` and `url`"):
        make("mcp", {**good, "url": "http://127.0.0.1:9/mcp"})
    with pytest.raises(pydantic.ValidationError, match="sets neither of `command` and `url`"):
        make("mcp", {key: value for key, value in good.items() if key not in ("command", "args", "env")})
    with pytest.raises(pydantic.ValidationError, match="Extra inputs are not permitted"):
        make("mcp", {**good, "server": "x"})
    with pytest.raises(EnvError, match=r"no task file at .*missing.jsonl"):
        make("mcp", {**good, "tasks": str(tmp_path / "missing.jsonl")})
    (tmp_path / "bad.jsonl").write_text('{"prompt": "ok"}\n{"target": 1}\n')
    with pytest.raises(EnvError, match=r"bad.jsonl, line 2: a task is a JSON object with a non-empty \"prompt\""):
        make("mcp", {**good, "tasks": str(tmp_path / "bad.jsonl")})
    with pytest.raises(EnvError, match="'no_such_module:reward' cannot be imported: No module named 'no_such_module'"):
        make("mcp", {**good, "reward": "no_such_module:reward"})
    with pytest.raises(EnvError, match="must look like 'module:function'"):
        make("mcp", {**good, "reward": "reward"})
    with pytest.raises(EnvError, match="must accept keyword arguments task, messages, tool_results and answer"):
        make("mcp", {**good, "reward": "json:dumps"})
    with pytest.raises(EnvError, match=r"no task .* is in split 'validation'"):
        make("mcp", good).tasks("validation")


def test_train_with_bad_options_exits_with_the_error_not_a_traceback(tmp_path):
    options = json.dumps({**server_options(tmp_path), "url": "http://127.0.0.1:9/mcp"})
    settings = ["env.name=mcp", f"env.options={options}", "model.name=tiny-random", "warm_start.iterations=0"]
    result = run_cli("train", RECIPE, *(item for key in settings for item in ("--set", key)), cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "invalid config (env.options of env mcp)" in result.stderr and "sets both of `command` and `url`" in (
        result.stderr
    )


def test_without_the_mcp_package_the_error_names_the_extra(tmp_path, monkeypatch):
    env = make("mcp", server_options(tmp_path))  # options, tasks and reward need no mcp package
    monkeypatch.setitem(sys.modules, "mcp", None)  # what `import mcp` meets where it is not installed
    with pytest.raises(EnvError, match=r"needs the mcp package: pip install -e '\.\[mcp\]'"):
        env.reset(0)


def test_a_server_that_cannot_start_or_lacks_a_named_tool_is_named(tmp_path):
    env = make("mcp", {**server_options(tmp_path), "command": str(tmp_path / "no-such-server")})
    with pytest.raises(EnvUnavailable, match=r"MCP server `.*no-such-server .*mcp_server.py` did not start"):
        env.reset(0)
    env.close()
    env = make("mcp", server_options(tmp_path, tools=["add", "sqrt"]))
    try:
        with pytest.raises(
            EnvError, match=r"tools names \['sqrt'\], which MCP server .* does not offer; it offers: add"
        ):
            env.reset(0)
    finally:
        env.close()


def sampler_for(tmp_path: Path, engine: str, crashes: int = 0, *settings: str):
    options = server_options(tmp_path)
    options["env"]["MCP_TEST_CRASHES"] = str(crashes)
    overrides = [
        "model.name=tiny-random",
        "env.name=mcp",
        f"env.options={json.dumps(options)}",
        f"sampler.engine={engine}",
        "sampler.envs_per_sampler=1",
        "sampler.num_cpus=0.25",
        "sampler.sampling.max_new_tokens=8",
        *settings,
    ]
    config = load_config(RECIPE, overrides)
    return (
        ray.remote(SamplerActor)
        .options(num_cpus=config.sampler.num_cpus, max_concurrency=100)
        .remote(index=0, model=config.model, sampler=config.sampler, env=config.env, seed=0)
    )


@pytest.mark.slow  # CI: test_a_killed_server_fails_the_step_and_the_next_reset_starts_a_new_one, at the env
def test_a_server_that_dies_in_a_sampler_fails_the_episode_and_the_next_episode_works(ray_local, tmp_path):
    # The server exits at the first two `crash` calls: the episode's try and its retry on a fresh env actor (a
    # fresh server), so the sampler records it as failed; the third server survives and the next episode plays.
    sampler = sampler_for(tmp_path, "tests.integration.test_mcp_env:CrashingEngine", crashes=2)
    try:
        [killed] = ray.get(start_collect(sampler, [EpisodeRequest(task_id=0, group=0, seed=1, horizon=2)]))
        [next_episode] = ray.get(start_collect(sampler, [EpisodeRequest(task_id=1, group=0, seed=2, horizon=2)]))
        state = ray.get(sampler.state.remote())
    finally:
        ray.kill(sampler)
    assert killed.failed and not killed.step_rewards
    assert killed.failure_reason.count("McpServerError") == 2 and "mcp_server.py` failed to call tool 'crash'" in (
        killed.failure_reason
    )
    assert not next_episode.failed and len(next_episode.actions) == 2
    assert state["env_replacements"] == 2 and len(list(tmp_path.glob("*.crash"))) == 2


def test_in_tools_format_the_servers_tools_are_offered_and_each_call_steps_the_env(ray_local, tmp_path):
    sampler = sampler_for(
        tmp_path,
        "tests.integration.test_mcp_env:AddingEngine",
        0,
        "env.action_format=tools",
        "sampler.sampling.max_new_tokens=64",
    )
    try:
        [episode] = ray.get(start_collect(sampler, [EpisodeRequest(task_id=0, group=0, seed=1, horizon=2)]))
    finally:
        ray.kill(sampler)
    assert not episode.failed and len(episode.actions) == 2
    system = episode.messages[0]["content"]
    assert "Call one tool a turn" in system and '"name": "add"' in system and "Action: <tool name>" not in system
    assert "5.0" in episode.messages[3]["content"]  # the call's result, the observation after the first turn


@pytest.mark.slow  # CI trains on an MCP server through docs/examples/mcp_calculator.py (tests/e2e/test_examples.py)
def test_train_two_iterations_on_the_mcp_server(tmp_path, monkeypatch):
    options = json.dumps(server_options(tmp_path, max_turns=3))
    settings = {
        "env.name": "mcp",
        "env.options": options,
        "model.name": "tiny-random",
        "warm_start.iterations": 0,
        "curriculum.schedule": "fixed",
        "curriculum.horizon": 3,
        "algorithm.skip_uniform_groups": "false",  # tiny-random never answers: every group's rewards are 0
        "algorithm.entropy_coef": 0.01,  # so the weights move all the same
        "trainer.iterations": 2,
        "trainer.tasks_per_iteration": 2,
        "algorithm.group_size": 2,
        "sampler.envs_per_sampler": 2,
        "sampler.sampling.max_new_tokens": 16,
        "logging.progress": "false",
        "run.dir": str(tmp_path / "runs"),
        "run.name": "mcp",
    }
    overrides = [item for key, value in settings.items() for item in ("--set", f"{key}={value}")]
    # the env actors import the reward by its module path, as they would a user's
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(SERVER.parents[2]), os.environ.get("PYTHONPATH")]))
    )
    result = run_cli("train", RECIPE, *overrides, cwd=tmp_path)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    run = tmp_path / "runs" / "mcp"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [record["iteration"] for record in records] == [0, 1]
    assert all(record["rollout/episodes"] == 4 for record in records)
    assert [record["weights_version"] for record in records] == [1, 2]
    assert all(record["learner/grad_norm"] > 0 for record in records)
    episodes = [json.loads(line) for line in (run / "trajectories" / "iter_000001.jsonl").read_text().splitlines()]
    assert len(episodes) == 4 and not any(episode["failed"] for episode in episodes)
    assert all(episode["env"] == "mcp" and episode["task_id"] in (0, 1) for episode in episodes)

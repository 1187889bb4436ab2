"""A tool-calling agent written with the OpenAI Agents SDK trains a run through the endpoint (``trainer.mode:
gateway``, Ray on 127.0.0.1): its BabyAI actions are ``@function_tool`` s that step a real BabyAI env, and the run
trains on its episodes (one of them read as a stream), token for token what the replica sampled from the prompts
the book should build.

tiny-random writes no parseable call, so the replicas serve with the scripted engine of
``tests/integration/scripted_tool_engine.py``: its replies are hermes calls chosen by the turn (one call with an
argument, then two calls at once, then text), and every id the endpoint returns and records is one that engine
produced. The run's learner trains tiny-random on those ids.

Two more clients use the plain ``openai`` client: one echoes a call's arguments re-serialized (other spacing), one
edits them. The re-serialized episode trains, the edited one never does.
"""

from __future__ import annotations

import asyncio
import functools
import json
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

from agentgym_rl.actors.chat import ChatFormat
from agentgym_rl.actors.engines import EngineSpec, register_engine
from agentgym_rl.actors.model_store import TINY_RANDOM, load_tokenizer
from agentgym_rl.actors.tool_formats import HermesFormat, ToolChat
from agentgym_rl.actors.trajectory import Trajectory
from agentgym_rl.actors.weight_sync import free_port
from agentgym_rl.configs.schema import SamplingConfig
from agentgym_rl.driver.modes.gateway import GatewayTrainer
from agentgym_rl.driver.run import prepare_run
from agentgym_rl.envs import InvalidAction, make
from agentgym_rl.envs.tools import Function, ToolCall
from tests.integration.scripted_tool_engine import ScriptedToolEngine

TASK = 121  # a BabyAI task; every episode plays it
MAX_TOKENS = 64
post = functools.partial(httpx.post, timeout=120)


set_tracing_disabled(True)  # the SDK would send traces to OpenAI


# --8<-- [start:agent]
async def play_babyai(
    policy: str, model: str, task_id: int, group: str, *, stream: bool = False, http_client=None
) -> dict:
    """One BabyAI game played by an Agents SDK agent as one episode of the endpoint (``stream``: the model's
    replies read as they are streamed); returns its account."""
    endpoint = httpx.AsyncClient(base_url=policy, timeout=30)
    opened = await endpoint.post("/v1/episodes", json={"env": "babyai", "task_id": task_id, "group": group})
    episode = opened.json()
    env = make("babyai")
    first = env.reset(task_id)
    steps, lock = [], threading.Lock()  # the SDK may run a reply's calls at once

    def act(name: str, **arguments: str) -> str:
        """Step the env on the action a call stands for (or say why it is no action)."""
        action = env.action_of_call(ToolCall(id="call_0", name=name, arguments=arguments))
        if isinstance(action, InvalidAction):
            return action.reason
        with lock:
            steps.append(env.step(action))
            return steps[-1].observation

    @function_tool
    def go_to(object: str) -> str:
        """Walk up to a visible object or door, e.g. 'red ball 1'."""
        return act("go_to", object=object)

    @function_tool
    def turn_left() -> str:
        """Turn left, staying in place."""
        return act("turn_left")

    @function_tool
    def move_forward() -> str:
        """Move one step forward."""
        return act("move_forward")

    client = AsyncOpenAI(base_url=f"{policy}/v1", api_key="unused", http_client=http_client)
    agent = Agent(
        name="babyai",
        instructions="You are an agent in a grid world. Act by calling the functions; say when you are done.",
        tools=[go_to, turn_left, move_forward],
        model=OpenAIChatCompletionsModel(model=model, openai_client=client),
        # The episode token tags every call the agent makes.
        model_settings=ModelSettings(max_tokens=MAX_TOKENS, extra_headers={"X-Episode-Token": episode["token"]}),
    )
    if stream:
        result = Runner.run_streamed(agent, first.text, max_turns=6)
        async for _ in result.stream_events():
            pass
    else:
        result = await Runner.run(agent, first.text, max_turns=6)
    closed = await endpoint.post(
        f"/v1/episodes/{episode['id']}/reward",
        json={"reward": max((step.reward for step in steps), default=0.0)},
        headers={"X-Episode-Token": episode["token"]},
    )
    await endpoint.aclose()
    return {"final_output": result.final_output, "steps": len(steps), "account": closed.json()}


# --8<-- [end:agent]


class Transcripts:
    """What each episode's client sent, call by call (an httpx request hook on the client)."""

    def __init__(self) -> None:
        self.calls: dict[str, list[dict]] = {}

    def hook(self, request: httpx.Request) -> None:
        token = request.headers.get("x-episode-token")
        if token and request.url.path.endswith("/chat/completions"):
            self.calls.setdefault(token, []).append(json.loads(request.content))

    async def async_hook(self, request: httpx.Request) -> None:
        self.hook(request)


def plain_client_episode(policy: str, label: str, transcripts: Transcripts, echo) -> None:
    """An agent written with the plain openai client (no framework): three calls, each reply's calls answered,
    each reply echoed back through ``echo(turn, calls)``; the tool results name ``label``."""
    opened = post(f"{policy}/v1/episodes", json={"env": "babyai", "task_id": TASK, "group": "plain"}).json()
    headers = {"X-Episode-Token": opened["token"]}
    client = openai.OpenAI(
        base_url=f"{policy}/v1",
        api_key="unused",
        max_retries=0,
        http_client=httpx.Client(timeout=120, event_hooks={"request": [transcripts.hook]}),
    )
    tools = [f.openai() for f in TOOLS]
    messages = [{"role": "system", "content": "Play the grid game."}, {"role": "user", "content": "A red ball."}]
    for turn in range(3):
        reply = client.chat.completions.create(
            model=TINY_RANDOM, messages=messages, tools=tools, max_tokens=MAX_TOKENS, extra_headers=headers
        )
        message = reply.choices[0].message
        if not message.tool_calls:
            break
        assert reply.choices[0].finish_reason == "tool_calls"
        calls = [c.model_dump(include={"id", "type", "function"}) for c in message.tool_calls]
        messages.append({"role": "assistant", "content": message.content, "tool_calls": echo(turn, calls)})
        messages += [
            {"role": "tool", "tool_call_id": c["id"], "content": f"{label}: {c['function']['name']} done"}
            for c in calls
        ]
    post(f"{policy}/v1/episodes/{opened['id']}/reward", json={"reward": 1.0}, headers=headers)


def as_is(turn: int, calls: list[dict]) -> list[dict]:
    return calls


def re_serialized(turn: int, calls: list[dict]) -> list[dict]:
    """The same arguments dumped again with other spacing, as some clients do."""
    for call in calls:
        call["function"]["arguments"] = json.dumps(json.loads(call["function"]["arguments"]), indent=2)
    return calls


def edited(turn: int, calls: list[dict]) -> list[dict]:
    """The first reply's call sent back with other arguments."""
    if turn == 0:
        calls[0]["function"]["arguments"] = json.dumps({"object": "blue ball 1"})
    return calls


TOOLS = [
    Function(
        name="go_to",
        description="Walk up to a visible object.",
        parameters={"type": "object", "properties": {"object": {"type": "string"}}, "required": ["object"]},
    ),
    Function(name="turn_left", description="Turn left."),
    Function(name="move_forward", description="Move one step forward."),
]


def shared_messages(messages: list[dict]) -> list[dict]:
    """OpenAI's messages as a client sends them, in the form the book reads (content parts joined, calls parsed)."""
    shared = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            content = "\n".join(part["text"] for part in content)
        out = {"role": message["role"], "content": content}
        if message.get("tool_calls"):
            out["tool_calls"] = [
                ToolCall(id=c["id"], name=c["function"]["name"], arguments=json.loads(c["function"]["arguments"]))
                for c in message["tool_calls"]
            ]
        if message["role"] == "tool":
            out["tool_call_id"] = message["tool_call_id"]
        shared.append(out)
    return shared


def replay(calls: list[dict], tools: ToolChat, engine: ScriptedToolEngine) -> list[int]:
    """The ids an episode of these calls should train on: the opening (messages and tools of the first call)
    rendered once, then per call the engine's reply to the ids so far and the next call's new messages appended
    as the turn's continuation; the history is never rendered again."""
    functions = [
        Function(name=t["function"]["name"], description=t["function"].get("description") or "", parameters=p)
        for t in calls[0]["tools"]
        for p in [t["function"].get("parameters") or {"type": "object", "properties": {}}]
    ]
    ids = tools.prompt_ids(shared_messages(calls[0]["messages"]), functions)
    previous: list[int] | None = None
    for index, body in enumerate(calls):
        if previous is not None:
            echoed = len(calls[index - 1]["messages"]) + 1  # the history, then the reply as the client echoes it
            ids = ids + tools.continuation_ids(previous, shared_messages(body["messages"][echoed:]))
        generation = engine.generate([ids], SamplingConfig(max_new_tokens=MAX_TOKENS))[0]
        ids, previous = ids + generation.token_ids, generation.token_ids
    return ids


def trained(run: Path) -> dict[int, list[Trajectory]]:
    files = sorted((run / "trajectories").glob("iter_*.jsonl"))
    return {
        int(path.stem.removeprefix("iter_")): [Trajectory.model_validate_json(line) for line in path.open()]
        for path in files
    }


def wait_for(condition, what: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(1)


def healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.slow
@pytest.mark.ci
def test_an_agents_sdk_agent_trains_a_gateway_run_on_exactly_what_the_replica_sampled(ray_local, tmp_path: Path):
    register_engine("scripted-tools", ScriptedToolEngine)
    port = free_port()
    policy = f"http://127.0.0.1:{port}"
    settings = [
        "model.name=tiny-random",
        "model.adapter=null",
        "warm_start.iterations=0",
        "trainer.mode=gateway",
        "trainer.iterations=2",
        "trainer.tasks_per_iteration=1",
        "trainer.gateway.poll_s=0.5",
        "algorithm.group_size=2",
        "algorithm.skip_uniform_groups=false",
        "learner.num_cpus=0.5",
        "serve.enabled=true",
        f"serve.port={port}",
        "serve.engine=scripted-tools",
        "serve.num_cpus=0.5",
        f"serve.max_tokens={MAX_TOKENS}",
        "serve.episodes.on_rewrite=mismatch",  # the edited episode is marked, never trained
        "logging.progress=false",
        f"run.dir={tmp_path}",
        "run.name=tools",
    ]
    config, run_dir = prepare_run(None, settings, None)
    trainer = GatewayTrainer(config, run_dir)
    outcome: dict = {}

    def target() -> None:
        try:
            outcome["last"] = trainer.run()
        except Exception as exc:  # noqa: BLE001 -- handed to the test's thread
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    transcripts = Transcripts()
    try:
        wait_for(lambda: healthy(policy) or not thread.is_alive(), "the endpoint", 300)
        assert thread.is_alive(), outcome
        # Iteration 1: the plain clients' group. The edited episode is closed first: if it could train, it would.
        for label, echo in (("edited", edited), ("re-serialized", re_serialized), ("as-is", as_is)):
            plain_client_episode(policy, label, transcripts, echo)

        # Iteration 2: two games of the Agents SDK agent, one of them streamed.
        async def two_games() -> list[dict]:
            hooks = {"request": [transcripts.async_hook]}
            async with httpx.AsyncClient(timeout=120, event_hooks=hooks) as http:
                return [
                    await play_babyai(policy, TINY_RANDOM, TASK, "sdk", stream=stream, http_client=http)
                    for stream in (False, True)
                ]

        games = asyncio.run(two_games())
        thread.join(timeout=300)
        assert not thread.is_alive(), "the run did not finish its two iterations"
    finally:
        if thread.is_alive():
            trainer.stop_actors()
    assert "error" not in outcome, outcome

    for game in games:  # the agent called functions twice (three BabyAI steps), then answered in text
        assert game["steps"] == 3 and game["final_output"] == "I have finished.", game
        assert game["account"]["turns"] == 3 and game["account"]["trainable"], game
    records = run_dir.read_metrics()
    assert [r["weights_version"] for r in records] == [1, 2]
    assert records[-1]["episodes/mismatched"] == 1

    chat = ChatFormat(load_tokenizer(TINY_RANDOM))
    tools = ToolChat(chat, HermesFormat(), "builtin")
    engine = ScriptedToolEngine.build(
        EngineSpec(
            model_name=TINY_RANDOM,
            dtype="float32",
            seed=0,
            stop_token_ids=[chat.tokenizer.eos_token_id],
            pad_token_id=0,
        )
    )
    episodes = {token: replay(calls, tools, engine) for token, calls in transcripts.calls.items()}
    assert sum(all(body.get("stream") for body in calls) for calls in transcripts.calls.values()) == 1
    by_iteration = trained(run_dir.path)
    assert sorted(by_iteration) == [0, 1]
    for iteration, trajectories in by_iteration.items():
        assert len(trajectories) == 2
        for trajectory in trajectories:
            assert trajectory.token_ids in episodes.values(), f"iteration {iteration}: trained on ids no replay gives"
            sampled = [i for start, end in trajectory.turn_spans for i in range(start, end)]
            assert [i for i, m in enumerate(trajectory.loss_mask) if m] == sampled
            assert len(trajectory.turn_spans) == 3
    # the plain group trained on the re-serialized and the as-is episodes, never on the edited one
    results = sorted(t.messages[3]["content"].split(":")[0] for t in by_iteration[0])
    assert results == ["<tool_response>\nas-is", "<tool_response>\nre-serialized"]
    # the samplers' layout: messages are the plain text the model saw, its calls as it wrote them
    for trajectory in by_iteration[1]:
        assert trajectory.messages[0]["role"] == "system" and "<tools>" in trajectory.messages[0]["content"]
        assert [m["content"].count("<tool_call>") for m in trajectory.messages if m["role"] == "assistant"] == [1, 2, 0]

"""A tool-calling agent written with the OpenAI Agents SDK (`openai-agents`), which knows nothing of agentgym-rl:
BabyAI's actions are its `@function_tool`s, each of which steps a game on an AgentGym-protocol env server, and its
model is the policy endpoint. The endpoint records each game as an episode, closed with the env's reward, and a
run in `trainer.mode: gateway` behind it learns from the games.

    python docs/examples/agents_sdk_agent.py --policy http://127.0.0.1:8000 --env http://127.0.0.1:36001 \\
        --tasks 0 1 2 3 --group-size 2 --rounds 3

It takes the options of `gateway_agent.py` (rounds, groups, `--paced`, `--system-file`, `--transcripts`). A game
ends when the env says it is done, when the model answers without a call, or after `--turns` model calls. Each call
of a game carries its own seed (the game's seed times 1000 plus the call's number), so a game replays exactly.

Without `--policy` and `--env` it starts both itself, like `gateway_agent.py`, and checks that the two-iteration
run on tiny-random trained on the agent's games, in groups of one task each.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
from pathlib import Path

import requests
from agents import (
    Agent,
    FunctionToolResult,
    MaxTurnsExceeded,
    ModelBehaviorError,
    ModelSettings,
    OpenAIChatCompletionsModel,
    RunContextWrapper,
    Runner,
    ToolsToFinalOutputResult,
    function_tool,
    set_tracing_disabled,
)
from gateway_agent import HTTP_TIMEOUT_S, close_game, main, open_game, trained_trajectories
from openai import AsyncOpenAI

SYSTEM = "You are an agent in a grid world. Act by calling one function per turn."

set_tracing_disabled(True)  # the SDK would send its traces to OpenAI


class SeededModel(OpenAIChatCompletionsModel):
    """The endpoint as the agent's model, each call sent with the next seed of the game (``seed``, ``seed + 1``,
    ...) and its reply kept in ``replies``."""

    def __init__(self, *, model: str, openai_client: AsyncOpenAI, seed: int) -> None:
        super().__init__(model=model, openai_client=openai_client)
        self.seed, self.replies = seed, []

    async def get_response(self, system_instructions, input, model_settings, *args, **kwargs):
        extra = {**(model_settings.extra_args or {}), "seed": self.seed + len(self.replies)}
        settings = dataclasses.replace(model_settings, extra_args=extra)
        response = await super().get_response(system_instructions, input, settings, *args, **kwargs)
        self.replies.append([item.model_dump(exclude_none=True) for item in response.output])
        return response


def babyai_tools(env: str, env_id: int, steps: list[dict]) -> list:
    """BabyAI's actions as function tools on game ``env_id`` of env server ``env``; each step's response is
    appended to ``steps``."""

    def act(action: str) -> str:
        step = requests.post(f"{env}/step", json={"id": env_id, "action": action}, timeout=HTTP_TIMEOUT_S).json()
        steps.append(step)
        return step["observation"]

    @function_tool
    def turn_left() -> str:
        """Turn left, staying in place."""
        return act("turn left")

    @function_tool
    def turn_right() -> str:
        """Turn right, staying in place."""
        return act("turn right")

    @function_tool
    def move_forward() -> str:
        """Move one step forward."""
        return act("move forward")

    @function_tool
    def pickup(object: str) -> str:
        """Walk to a visible ball, box or key and pick it up (carry one object at a time).

        Args:
            object: The object as the observation names it, e.g. 'red ball 1'.
        """
        return act(f"pickup {object}")

    @function_tool
    def drop() -> str:
        """Drop the carried object on the empty cell ahead."""
        return act("drop")

    @function_tool
    def toggle() -> str:
        """Open or close the door directly ahead."""
        return act("toggle")

    @function_tool
    def go_to(object: str) -> str:
        """Walk up to a visible object or door (face it), or onto the goal.

        Args:
            object: The object as the observation names it, e.g. 'red ball 1', 'grey open door 2', or 'goal'.
        """
        return act(f"go to {object}")

    @function_tool
    def go_through(door: str) -> str:
        """Walk through a visible open door.

        Args:
            door: The door as the observation names it, e.g. 'blue open door 1'.
        """
        return act(f"go through {door}")

    @function_tool
    def toggle_and_go_through(door: str) -> str:
        """Walk to a visible closed or locked door, open it (a locked one needs the key of its color) and walk
        through.

        Args:
            door: The door as the observation names it, e.g. 'yellow locked door 1'.
        """
        return act(f"toggle and go through {door}")

    @function_tool
    def check_available_actions() -> str:
        """List the actions available now."""
        return act("check available actions")

    return [
        turn_left,
        turn_right,
        move_forward,
        pickup,
        drop,
        toggle,
        go_to,
        go_through,
        toggle_and_go_through,
        check_available_actions,
    ]


async def play_turns(args: argparse.Namespace, env_id: int, first: str, seed: int, headers: dict) -> tuple[list, list]:
    """The agent's turns of game ``env_id`` from observation ``first``: its replies and the env's steps."""
    steps: list[dict] = []

    def done_yet(context: RunContextWrapper, results: list[FunctionToolResult]) -> ToolsToFinalOutputResult:
        """The game ends when the env says so; otherwise the model sees the tools' results and acts again."""
        if steps and steps[-1]["done"]:
            return ToolsToFinalOutputResult(is_final_output=True, final_output=steps[-1]["observation"])
        return ToolsToFinalOutputResult(is_final_output=False)

    client = AsyncOpenAI(base_url=f"{args.policy}/v1", api_key="unused", max_retries=3)
    model = SeededModel(model=args.model, openai_client=client, seed=seed * 1000)
    agent = Agent(
        name="babyai",
        instructions=args.system,
        tools=babyai_tools(args.env, env_id, steps),
        model=model,
        # one action per turn; the episode token tags every call of the game
        model_settings=ModelSettings(
            temperature=1.0, max_tokens=args.max_tokens, parallel_tool_calls=False, extra_headers=headers
        ),
        tool_use_behavior=done_yet,
    )
    # The turn limit ends the game like any other, and so does a call of a function the agent does not have
    # (the SDK raises ModelBehaviorError for it): the game is lost, its episode closed with reward 0.
    with contextlib.suppress(MaxTurnsExceeded, ModelBehaviorError):
        await Runner.run(agent, first, max_turns=args.turns)
    await client.close()
    return model.replies, steps


def play(args: argparse.Namespace, task_id: int, group: str, seed: int) -> dict:
    """One game of ``task_id`` as one episode, closed with the env's last reward (its turns in an event loop of
    their own: games run in threads side by side)."""
    episode, headers, env_id, observation = open_game(args, task_id, group)
    replies, steps = asyncio.run(play_turns(args, env_id, observation["observation"], seed, headers))
    reward = float(steps[-1]["reward"]) if steps else 0.0
    return close_game(args, episode, env_id, reward, task_id=task_id, group=group, replies=replies, steps=len(steps))


def check_groups(run: Path, results: list[dict], group_size: int) -> None:
    """The run trained twice, on the agent's games: groups of ``group_size`` games of one task, each task one the
    agent played, each with as many model turns as the agent's game of that task had replies."""
    trained = trained_trajectories(run)
    played = {(result["task_id"], len(result["replies"])) for result in results}
    groups: dict[tuple[str, int], list[dict]] = {}
    for name, trajectory in trained:
        assert (trajectory["task_id"], len(trajectory["turn_spans"])) in played, trajectory["task_id"]
        groups.setdefault((name, trajectory["group"]), []).append(trajectory)
    assert all(len({t["task_id"] for t in members}) == 1 for members in groups.values())
    assert {len(members) for members in groups.values()} == {group_size}
    print(f"the run trained on {len(trained)} of the agent's games over 2 iterations")


if __name__ == "__main__":
    main(__doc__, SYSTEM, play, check_groups)

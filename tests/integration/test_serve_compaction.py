"""An agent that compacts its history mid-episode, on the live endpoint (Ray Serve on 127.0.0.1, tiny-random, the
plain openai client): with ``serve.episodes.on_rewrite: segment`` the episode trains as two segments, each token
for token what the replica sampled; with ``mismatch`` the same episode is marked and never trains."""

from __future__ import annotations

import functools

import httpx
import openai
import pytest
import ray
import torch

from agentgym_rl.actors.chat import ChatFormat
from agentgym_rl.actors.engines.serving import choice_seed, seeded_generator
from agentgym_rl.actors.model_store import TINY_RANDOM, load_tokenizer
from agentgym_rl.actors.weight_sync import free_port
from agentgym_rl.configs.schema import EpisodesConfig, SamplingConfig, ServeConfig
from agentgym_rl.serve.app import APP_NAME, ServeArgs, start_server, stop_server
from agentgym_rl.serve.deployment import STORE_NAMESPACE, episodes_name
from tests.integration.test_serve_episodes import replay_engine

MAX_TOKENS = 12
post = functools.partial(httpx.post, timeout=120)
get = functools.partial(httpx.get, timeout=120)
SYSTEM = {"role": "system", "content": "You play a grid game."}
OPENING = [SYSTEM, {"role": "user", "content": "You see a red ball."}]
OBSERVATIONS = ["You moved forward.", "You see a wall.", "You turned left.", "You see a door.", "The door opens."]
SUMMARY = [SYSTEM, {"role": "user", "content": "Summary so far: you moved, turned and found a door. Open it."}]
SEED = 11


@pytest.fixture(scope="module")
def server(ray_local, request):
    port = free_port()
    config = ServeConfig(
        port=port,
        max_tokens=MAX_TOKENS,
        max_prompt_tokens=400,
        episodes=EpisodesConfig(reward_range=(0.0, 1.0), on_rewrite=request.param),
    )
    start_server(ServeArgs(model=TINY_RANDOM, dtype="float32", serve=config))
    yield f"http://127.0.0.1:{port}"
    stop_server()


def compacting_agent(url: str, token: str) -> list[list[dict]]:
    """Four turns on the whole history, then the history replaced by a summary, then two more turns; returns
    the histories it sent before and after compacting (each ending with its last reply)."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    sent, messages, observations = [], list(OPENING), iter(OBSERVATIONS)
    for turn in range(6):
        if turn == 4:
            sent.append(messages[:-1])  # the last observation is folded into the summary
            messages = list(SUMMARY)
        reply = client.chat.completions.create(
            model=TINY_RANDOM,
            messages=messages,
            max_tokens=MAX_TOKENS,
            seed=SEED + turn,
            extra_headers={"X-Episode-Token": token},
        )
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
        if turn < 5:
            messages.append({"role": "user", "content": next(observations)})
    return [*sent, messages]


def play(url: str) -> tuple[dict, list[list[dict]]]:
    opened = post(f"{url}/v1/episodes", json={"env": "babyai", "task_id": 5, "group": "compacted"}).json()
    histories = compacting_agent(url, opened["token"])
    headers = {"X-Episode-Token": opened["token"]}
    closed = post(f"{url}/v1/episodes/{opened['id']}/reward", json={"reward": 1.0}, headers=headers)
    assert closed.status_code == 200, closed.text
    return closed.json(), histories


def harvest() -> list:
    return ray.get(ray.get_actor(episodes_name(APP_NAME), namespace=STORE_NAMESPACE).harvest.remote())


@pytest.mark.parametrize("server", ["segment"], indirect=True)
def test_a_compacted_episode_trains_as_two_segments_each_token_exact(server):
    info, histories = play(server)
    assert info["trainable"] and info["turns"] == 6 and info["mismatch"] is None
    assert [(s["began_at_turn"], s["turns"]) for s in info["segments"]] == [(0, 4), (4, 2)]
    assert info["segments"][1]["reason"].startswith("message 1 differs from what this episode recorded")
    first, second = [trajectory for group, trajectory in harvest() if group == "compacted"]
    assert (first.segment, second.segment) == (0, 1)

    # Replay the replica's seeded samples on a local engine from the prompts the book should build: each
    # segment's opening rendered once, then every sampled reply followed by its observation's continuation.
    chat = ChatFormat(load_tokenizer(TINY_RANDOM))
    engine = replay_engine(chat)
    sampling = SamplingConfig(max_new_tokens=MAX_TOKENS)
    segments = [(first, OPENING, OBSERVATIONS[:3], 0), (second, SUMMARY, OBSERVATIONS[4:], 4)]
    for (trajectory, opening, observations, first_turn), history in zip(segments, histories, strict=True):
        ids, previous = chat.prompt_ids(opening), None
        for turn in range(len(trajectory.turn_spans)):
            if previous is not None:
                ids = ids + chat.continuation_ids(previous, observations[turn - 1])
            seed = choice_seed(SEED + first_turn + turn, 0)
            generation = engine.generate([ids], sampling, [seeded_generator(seed)])[0]
            start, end = trajectory.turn_spans[turn]
            assert trajectory.token_ids[:start] == ids
            assert trajectory.token_ids[start:end] == generation.token_ids, (first_turn, turn)
            assert torch.allclose(
                torch.tensor(trajectory.logprobs[start:end]), torch.tensor(generation.logprobs), atol=1e-4
            )
            assert history[len(opening) + 2 * turn]["content"] == chat.decode_reply(generation.token_ids)
            ids, previous = ids + generation.token_ids, generation.token_ids
        assert trajectory.token_ids == ids
        assert [i for i, m in enumerate(trajectory.loss_mask) if m] == [
            i for start, end in trajectory.turn_spans for i in range(start, end)
        ]
    # the episode's reward reaches both segments: the outcome on each one's last turn
    assert first.step_rewards == [0.0, 0.0, 0.0, 1.0] and second.step_rewards == [0.0, 1.0]
    assert first.reward == second.reward == 1.0


@pytest.mark.parametrize("server", ["mismatch"], indirect=True)
def test_with_on_rewrite_mismatch_the_same_episode_is_marked_and_never_trains(server):
    info, histories = play(server)
    assert len(histories[1]) == len(SUMMARY) + 3  # the agent was still served after compacting
    assert info["mismatch"].startswith("message 1 differs") and not info["trainable"]
    assert info["turns"] == 4 and len(info["segments"]) == 1
    assert harvest() == []


@pytest.mark.parametrize("server", ["mismatch"], indirect=True)
def test_an_edited_reply_is_reported_on_the_episode_and_never_trains(server):
    opened = post(f"{server}/v1/episodes", json={"env": "babyai", "task_id": 5}).json()
    token = opened["token"]
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)
    first = client.chat.completions.create(
        model=TINY_RANDOM, messages=OPENING, max_tokens=MAX_TOKENS, user=f"episode:{token}"
    )
    assert first.choices[0].message.content is not None
    # the client changed what its agent said
    history = [*OPENING, {"role": "assistant", "content": "pick up the ball"}, {"role": "user", "content": "Go on."}]
    reply = client.chat.completions.create(
        model=TINY_RANDOM, messages=history, max_tokens=MAX_TOKENS, user=f"episode:{token}"
    )
    assert reply.choices[0].message.content is not None  # still served
    info = get(f"{server}/v1/episodes/{opened['id']}", headers={"X-Episode-Token": token}).json()
    assert "turn 1's assistant reply differs" in info["mismatch"] and info["turns"] == 1
    post(f"{server}/v1/episodes/{opened['id']}/reward", json={"reward": 1.0}, headers={"X-Episode-Token": token})
    assert harvest() == []

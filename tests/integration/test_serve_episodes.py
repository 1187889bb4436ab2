"""Episodes on the live endpoint (Ray Serve on 127.0.0.1, tiny-random): an agent using only the openai client
tags its calls with an episode and posts its reward; the endpoint records the ids it sampled, token for token.
Histories the agent rewrites: tests/integration/test_serve_compaction.py."""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
import ray
import torch

from agentgym_rl.actors.chat import ChatFormat
from agentgym_rl.actors.engines import Engine, make_engine
from agentgym_rl.actors.engines.serving import choice_seed, seeded_generator
from agentgym_rl.actors.model_store import TINY_RANDOM, load_tokenizer
from agentgym_rl.actors.weight_sync import free_port
from agentgym_rl.configs.schema import EpisodesConfig, SamplingConfig, ServeConfig
from agentgym_rl.serve.app import APP_NAME, ServeArgs, start_server, stop_server
from agentgym_rl.serve.deployment import STORE_NAMESPACE, episodes_name

MAX_TOKENS = 12
# Each HTTP call may wait 120 s: on a loaded 2-core CI machine the first answers take seconds.
post = functools.partial(httpx.post, timeout=120)
get = functools.partial(httpx.get, timeout=120)
OPENING = [{"role": "system", "content": "You play a grid game."}, {"role": "user", "content": "You see a red ball."}]
OBSERVATIONS = ["You moved forward.", "You see a wall.", "You picked up the ball."]


@pytest.fixture(scope="module")
def server(ray_local):
    port = free_port()
    config = ServeConfig(
        port=port,
        max_tokens=MAX_TOKENS,
        max_prompt_tokens=300,
        episodes=EpisodesConfig(reward_range=(0.0, 1.0)),
    )
    start_server(ServeArgs(model=TINY_RANDOM, dtype="float32", serve=config))
    yield f"http://127.0.0.1:{port}"
    stop_server()


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def open_episode(url: str, group: str | None = None) -> dict:
    response = post(f"{url}/v1/episodes", json={"env": "babyai", "task_id": 5, "group": group})
    assert response.status_code == 201, response.text
    return response.json()


def play(url: str, token: str, turns: int, seed: int = 7, stream: bool = False) -> list[dict[str, str]]:
    """An agent as a user of the plain openai client writes it: the whole history every call (``stream``: each
    reply read from its stream of chunks)."""
    messages = list(OPENING)
    for turn in range(turns):
        reply = client(url).chat.completions.create(
            model=TINY_RANDOM,
            messages=messages,
            max_tokens=MAX_TOKENS,
            seed=seed + turn,
            stream=stream,
            extra_headers={"X-Episode-Token": token},
        )
        text = "".join(c.choices[0].delta.content or "" for c in reply) if stream else reply.choices[0].message.content
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": OBSERVATIONS[turn]}]
    return messages


def harvest(app: str = APP_NAME) -> list:
    return ray.get(ray.get_actor(episodes_name(app), namespace=STORE_NAMESPACE).harvest.remote())


def replay_engine(chat: ChatFormat) -> Engine:
    """A local engine of the replica's model, to replay the replica's seeded samples."""
    return make_engine(
        "transformers",
        model_name=TINY_RANDOM,
        dtype="float32",
        seed=0,
        stop_token_ids=[chat.tokenizer.eos_token_id],
        pad_token_id=chat.tokenizer.pad_token_id,
    )


def test_the_ids_recorded_are_the_ids_the_replica_sampled_token_for_token(server):
    opened = open_episode(server, group="task-5")
    token = opened["token"]
    history = play(server, token, turns=3)
    closed = post(
        f"{server}/v1/episodes/{opened['id']}/reward", json={"reward": 1.0}, headers={"X-Episode-Token": token}
    )
    assert closed.status_code == 200, closed.text
    assert closed.json()["trainable"] and closed.json()["turns"] == 3
    [(group, trajectory)] = harvest()
    assert group == "task-5" and trajectory.step_rewards == [0.0, 0.0, 1.0]

    # Replay the same seeded samples on a local engine from the prompts the book should have built: the
    # opening's ids, then each sampled reply followed by its continuation, never the re-rendered history.
    chat = ChatFormat(load_tokenizer(TINY_RANDOM))
    engine = replay_engine(chat)
    ids, previous = chat.prompt_ids(OPENING), None
    sampling = SamplingConfig(max_new_tokens=MAX_TOKENS)
    for turn in range(3):
        if previous is not None:
            ids = ids + chat.continuation_ids(previous, OBSERVATIONS[turn - 1])
        generation = engine.generate([ids], sampling, [seeded_generator(choice_seed(7 + turn, 0))])[0]
        start, end = trajectory.turn_spans[turn]
        assert trajectory.token_ids[:start] == ids
        assert trajectory.token_ids[start:end] == generation.token_ids, f"turn {turn}"
        assert torch.allclose(
            torch.tensor(trajectory.logprobs[start:end]), torch.tensor(generation.logprobs), atol=1e-4
        )
        assert history[2 + 2 * turn]["content"] == chat.decode_reply(generation.token_ids)
        ids, previous = ids + generation.token_ids, generation.token_ids
    assert trajectory.token_ids == ids
    assert [i for i, m in enumerate(trajectory.loss_mask) if m] == [
        i for start, end in trajectory.turn_spans for i in range(start, end)
    ]


def test_a_streamed_episode_records_what_the_same_calls_unstreamed_record(server):
    played = {}
    for stream in (False, True):
        opened = open_episode(server, group=f"streamed-{stream}")
        history = play(server, opened["token"], turns=2, stream=stream)
        closed = post(
            f"{server}/v1/episodes/{opened['id']}/reward",
            json={"reward": 1.0},
            headers={"X-Episode-Token": opened["token"]},
        )
        assert closed.status_code == 200 and closed.json()["turns"] == 2, closed.text
        [trajectory] = [t for group, t in harvest() if group == f"streamed-{stream}"]
        played[stream] = (history, trajectory)
    (plain_history, plain), (streamed_history, streamed) = played[False], played[True]
    assert streamed_history == plain_history  # the same seeded replies, whole or in chunks
    assert (streamed.token_ids, streamed.turn_spans, streamed.loss_mask) == (
        plain.token_ids,
        plain.turn_spans,
        plain.loss_mask,
    )
    assert torch.allclose(torch.tensor(streamed.logprobs), torch.tensor(plain.logprobs), atol=1e-5)
    assert [m["content"] for m in streamed.messages if m["role"] == "assistant"] == [
        m["content"] for m in streamed_history if m["role"] == "assistant"
    ]


def bad_requests(url: str) -> dict[str, httpx.Response]:
    """Each kind of bad episode request once, against one open episode that must survive them."""
    opened = open_episode(url)
    token, episode = opened["token"], opened["id"]
    play(url, token, turns=1)
    other = open_episode(url)
    headers = {"X-Episode-Token": token}
    chat = {"model": TINY_RANDOM, "messages": OPENING, "max_tokens": 4}
    found = {
        "unknown episode": post(f"{url}/v1/chat/completions", json=chat, headers={"X-Episode-Token": "ep-00.secret"}),
        "wrong secret": get(f"{url}/v1/episodes/{episode}", headers={"X-Episode-Token": f"{episode}.wrong"}),
        "another episode's token": get(f"{url}/v1/episodes/{episode}", headers={"X-Episode-Token": other["token"]}),
        "reward out of range": post(f"{url}/v1/episodes/{episode}/reward", json={"reward": 2.0}, headers=headers),
        "over the context budget": post(
            f"{url}/v1/chat/completions",
            json={**chat, "messages": [{"role": "user", "content": "go " * 400}]},
            headers={"X-Episode-Token": other["token"]},
        ),
        "two replies": post(f"{url}/v1/chat/completions", json={**chat, "n": 2}, headers=headers),
    }
    first = post(f"{url}/v1/episodes/{episode}/reward", json={"reward": 1.0}, headers=headers)
    found["reward twice"] = post(f"{url}/v1/episodes/{episode}/reward", json={"reward": 0.0}, headers=headers)
    found["first reward"] = first
    return found


def test_bad_episode_requests_get_clear_4xx_while_a_good_client_keeps_being_served(server):
    with ThreadPoolExecutor(1) as pool:
        good = pool.submit(lambda: [play(server, open_episode(server)["token"], turns=2) for _ in range(3)])
        found = bad_requests(server)
        histories = good.result(timeout=600)
    assert all(len(history) == 6 for history in histories)
    expected = {
        "unknown episode": (404, "episode_not_found"),
        "wrong secret": (403, "episode_forbidden"),
        "another episode's token": (403, "episode_forbidden"),
        "reward out of range": (400, "invalid_reward"),
        "over the context budget": (400, "context_length_exceeded"),
        "two replies": (400, None),
        "reward twice": (409, "episode_closed"),
    }
    for case, (status, code) in expected.items():
        response = found[case]
        assert response.status_code == status, (case, response.text)
        error = response.json()["error"]
        assert error["message"] and error["code"] == code, (case, error)
    # nothing was lost: the first reward stood, and the episode trains once with it
    assert found["first reward"].json()["reward"] == 1.0
    rewards = sorted(trajectory.reward for _, trajectory in harvest())
    assert 1.0 in rewards

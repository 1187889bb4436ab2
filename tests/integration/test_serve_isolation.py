"""One client never fails another on the live endpoint (Ray Serve on 127.0.0.1, tiny-random, one app for the
module): vanishing sampling settings beside ordinary requests, every way out of an episode call, and one
client's flood of episodes."""

from __future__ import annotations

import contextlib
import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from agentgym_rl.actors.model_store import TINY_RANDOM
from agentgym_rl.actors.weight_sync import free_port
from agentgym_rl.configs.schema import EpisodesConfig, ServeConfig
from agentgym_rl.serve.app import ServeArgs, start_server, stop_server

# Rows and requests a replica holds at once (no queue): FILL long greedy streams take them all.
ROWS = 8
LONG = 2000  # tokens of a call meant to still be decoding when the test acts on it (greedy: it never stops early)
PROMPT = LONG + 200  # an episode's prompt and reply fit in max_prompt_tokens
PER_CLIENT = 3
CHAT = [{"role": "user", "content": "Say hello."}]
OPENING = [{"role": "system", "content": "You play a grid game."}, {"role": "user", "content": "You see a red ball."}]
# Inside every schema bound, yet 0 (or a denormal) in float32: what once failed the whole decode batch.
TINY_SETTINGS = [{"temperature": 1e-300}, {"temperature": 5e-324}, {"temperature": 1e-45}, {"top_p": 1e-300}]


@pytest.fixture(scope="module")
def url(ray_local):
    port = free_port()
    config = ServeConfig(
        port=port,
        max_tokens=LONG,
        max_prompt_tokens=PROMPT,
        max_batch_size=ROWS,
        max_queued_requests=0,
        max_n=1,
        kv_cache_tokens=ROWS * (PROMPT + LONG),
        episodes=EpisodesConfig(max_open_per_client=PER_CLIENT, on_rewrite="mismatch"),
    )
    start_server(ServeArgs(model=TINY_RANDOM, dtype="float32", serve=config))
    yield f"http://127.0.0.1:{port}"
    stop_server()


def post(url: str, path: str, body: dict | str, *, key: str | None = None, episode: str | None = None, **options):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if episode is not None:
        headers["X-Episode-Token"] = episode
    content = body if isinstance(body, str) else json.dumps(body)
    headers["Content-Type"] = "application/json"
    return httpx.post(url + path, content=content, headers=headers, timeout=options.get("timeout", 300))


def chat(**fields) -> dict:
    return {"model": TINY_RANDOM, "messages": CHAT, "max_tokens": 24, **fields}


def streamed_text(url: str, body: dict) -> tuple[int, str, list[str]]:
    """Status, the text and the raw events of a streamed chat call read to its end."""
    with httpx.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True}, timeout=300) as response:
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    text = "".join(
        choice["delta"].get("content", "")
        for event in events
        if event != "data: [DONE]"
        for choice in json.loads(event.removeprefix("data: ")).get("choices", [])
    )
    return response.status_code, text, events


def content(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["message"]["content"]


def test_tiny_temperatures_and_top_p_never_fail_the_chat_calls_decoding_beside_them(url):
    seeded = chat(seed=11, temperature=0.9, max_tokens=48)
    alone = content(post(url, "/v1/chat/completions", seeded))
    greedy = content(post(url, "/v1/chat/completions", chat(temperature=0)))
    with ThreadPoolExecutor(3 + len(TINY_SETTINGS)) as pool:
        ordinary = [
            pool.submit(post, url, "/v1/chat/completions", chat(max_tokens=48)),
            pool.submit(post, url, "/v1/chat/completions", seeded),
            pool.submit(streamed_text, url, chat(max_tokens=48)),
        ]
        attackers = [pool.submit(post, url, "/v1/chat/completions", chat(**tiny)) for tiny in TINY_SETTINGS]
        plain, again, (stream_status, stream_text, events) = [future.result() for future in ordinary]
        answers = [future.result() for future in attackers]
    assert content(plain) and content(again) == alone
    assert stream_status == 200 and stream_text and events[-1] == "data: [DONE]"
    assert not any('"error"' in event for event in events), events
    for tiny, answer in zip(TINY_SETTINGS, answers, strict=True):
        assert content(answer) == greedy, tiny  # a vanishing setting is greedy decoding


def test_tiny_temperatures_never_fail_the_act_calls_decoding_beside_them(url):
    def act(**fields) -> dict:
        return {"env": "babyai", "observation": "Your goal: go to the red ball", "max_tokens": 32, **fields}

    def completion(response: httpx.Response) -> str:
        assert response.status_code == 200, response.text
        return response.json()["completion"]

    seeded = act(seed=5, temperature=0.8)
    alone = completion(post(url, "/v1/act", seeded))
    greedy = completion(post(url, "/v1/act", act(temperature=0)))
    tiny = [act(temperature=1e-300), act(temperature=5e-324)]
    with ThreadPoolExecutor(5) as pool:
        futures = [pool.submit(post, url, "/v1/act", body) for body in [act(), seeded, act(seed=6), *tiny]]
        plain, again, other, *answers = [future.result() for future in futures]
    assert completion(plain) and completion(other) and completion(again) == alone
    assert [completion(answer) for answer in answers] == [greedy, greedy]


# ----------------------------------------------------------------------------- episodes: every way out of a call


def open_episode(url: str, key: str) -> str:
    response = post(url, "/v1/episodes", {"env": "babyai", "task_id": 3}, key=key)
    assert response.status_code == 201, response.text
    return response.json()["token"]


def episode_call(url: str, key: str, token: str, messages: list[dict], **fields) -> httpx.Response:
    body = {"model": TINY_RANDOM, "messages": messages, "max_tokens": 8, "seed": 1, **fields}
    return post(url, "/v1/chat/completions", body, key=key, episode=token)


def once_free(url: str, key: str, token: str, messages: list[dict]) -> httpx.Response:
    """The call, repeated while the episode still holds a call of a client that went away (the replica learns
    of it at its next step)."""
    deadline = time.monotonic() + 300
    while (response := episode_call(url, key, token, messages)).status_code == 409:
        assert response.json()["error"]["code"] == "episode_busy" and time.monotonic() < deadline, response.text
        time.sleep(0.2)
    return response


def finish(url: str, key: str, token: str, turns: int) -> None:
    """The episode took the good calls and nothing else, and takes its reward (nothing holds it)."""
    episode = token.partition(".")[0]
    headers = {"Authorization": f"Bearer {key}", "X-Episode-Token": token}
    described = httpx.get(f"{url}/v1/episodes/{episode}", headers=headers, timeout=60).json()
    assert described["turns"] == turns and described["mismatch"] is None, described
    closed = post(url, f"/v1/episodes/{episode}/reward", {"reward": 1.0}, key=key, episode=token)
    assert closed.status_code == 200, closed.text


def test_a_call_naming_the_wrong_model_leaves_the_episode_free(url):
    key = "wrong-model"
    token = open_episode(url, key)
    reply = content(episode_call(url, key, token, OPENING))
    history = [*OPENING, {"role": "assistant", "content": reply}, {"role": "user", "content": "You see a wall."}]
    body = {"model": "gpt-4o", "messages": history, "max_tokens": 8}
    wrong = [
        post(url, "/v1/chat/completions", body, key=key, episode=token),
        post(url, "/v1/chat/completions", {**body, "user": f"episode:{token}"}, key=key),
        post(url, "/v1/chat/completions", {**body, "stream": True}, key=key, episode=token),
    ]
    assert [(r.status_code, r.json()["error"]["code"]) for r in wrong] == [(404, "model_not_found")] * 3
    assert content(episode_call(url, key, token, history))
    finish(url, key, token, turns=2)


def test_bad_bodies_leave_the_episode_free(url):
    key = "bad-body"
    token = open_episode(url, key)
    bad = [
        '{"model": "tiny-random", "messages": [',  # not JSON
        {"model": TINY_RANDOM, "messages": OPENING, "n": 2},
        {"model": TINY_RANDOM, "messages": OPENING, "max_tokens": LONG + 1},
        {"model": TINY_RANDOM, "messages": OPENING, "temperature": 3.0},
        {"model": TINY_RANDOM, "messages": OPENING, "frobnicate": 1},
        {"model": TINY_RANDOM, "messages": [*OPENING, {"role": "assistant", "content": "I go."}]},  # a made-up turn
    ]
    answers = [post(url, "/v1/chat/completions", body, key=key, episode=token) for body in bad]
    statuses = [400] * (len(bad) - 1) + [409]  # the last does not fit what the episode recorded
    assert [answer.status_code for answer in answers] == statuses, [answer.text for answer in answers]
    assert content(episode_call(url, key, token, OPENING))
    finish(url, key, token, turns=1)


def test_a_call_the_engine_refuses_leaves_the_episode_free(url):
    """A full replica (every row decoding, no queue) refuses the call after the book admitted it: 429."""
    key = "engine-refusal"
    token = open_episode(url, key)
    fill = {"model": TINY_RANDOM, "messages": CHAT, "max_tokens": LONG, "temperature": 0, "stream": True}
    with contextlib.ExitStack() as streams:
        readers = []  # kept: a line iterator let go closes its connection, and the replica frees the row
        for _ in range(ROWS):
            response = streams.enter_context(httpx.stream("POST", url + "/v1/chat/completions", json=fill, timeout=300))
            readers.append(response.iter_lines())
            next(readers[-1])  # the role chunk: this request holds its row
        refused = episode_call(url, key, token, OPENING)
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "rate_limit_exceeded", refused.text
    deadline = time.monotonic() + 300
    while httpx.get(url + "/v1/policy", timeout=60).json()["stats"]["in_flight"]:  # the fills' rows are let go
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert content(episode_call(url, key, token, OPENING))
    finish(url, key, token, turns=1)


def test_a_client_that_goes_away_mid_call_leaves_the_episode_free(url):
    key = "gone"
    token = open_episode(url, key)
    with pytest.raises(httpx.ReadTimeout):
        body = {"model": TINY_RANDOM, "messages": OPENING, "max_tokens": LONG, "temperature": 0}
        post(url, "/v1/chat/completions", body, key=key, episode=token, timeout=1.0)
    assert content(once_free(url, key, token, OPENING))
    finish(url, key, token, turns=1)


def test_a_stream_cut_mid_reply_leaves_the_episode_free(url):
    key = "cut-stream"
    token = open_episode(url, key)
    body = {"model": TINY_RANDOM, "messages": OPENING, "max_tokens": LONG, "temperature": 0, "stream": True}
    headers = {"X-Episode-Token": token, "Authorization": f"Bearer {key}"}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, headers=headers, timeout=300) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        while '"content":""' in (line := next(lines)) or not line:
            pass  # past the role chunk: the reply is being sampled
    assert content(once_free(url, key, token, OPENING))
    finish(url, key, token, turns=1)


def test_one_client_at_its_bound_gets_429_while_another_still_opens_one(url):
    tokens = [open_episode(url, "flooder") for _ in range(PER_CLIENT)]
    refused = post(url, "/v1/episodes", {"env": "babyai", "task_id": 3}, key="flooder")
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "too_many_episodes_for_client"
    assert "max_open_per_client" in refused.json()["error"]["message"]
    assert open_episode(url, "neighbour")
    assert post(url, "/v1/episodes", {"env": "babyai", "task_id": 3}).status_code == 201  # no key: its address
    episode = tokens[0].partition(".")[0]
    closed = post(url, f"/v1/episodes/{episode}/reward", {"reward": 0.0}, key="flooder", episode=tokens[0])
    assert closed.status_code == 200, closed.text
    assert open_episode(url, "flooder")  # a closed episode no longer counts


def test_a_streamed_call_of_a_changed_history_is_served_and_holds_nothing(url):
    key = "changed-history"
    token = open_episode(url, key)
    reply = content(episode_call(url, key, token, OPENING))
    edited = [*OPENING, {"role": "assistant", "content": reply + " (edited)"}, {"role": "user", "content": "Go on."}]
    body = {"model": TINY_RANDOM, "messages": edited, "max_tokens": 8}
    headers = {"Authorization": f"Bearer {key}", "X-Episode-Token": token}
    with httpx.stream("POST", url + "/v1/chat/completions", json={**body, "stream": True}, headers=headers) as response:
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert response.status_code == 200 and events[-1] == "data: [DONE]"
    assert not any('"error"' in event for event in events), events
    episode = token.partition(".")[0]
    closed = post(url, f"/v1/episodes/{episode}/reward", {"reward": 1.0}, key=key, episode=token)
    assert closed.status_code == 200 and closed.json()["mismatch"] and closed.json()["turns"] == 1, closed.text

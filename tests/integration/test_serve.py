"""The Ray Serve policy endpoint on local Ray, over real HTTP on 127.0.0.1, with the official openai client."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
import ray
import torch
from pydantic import ValidationError
from ray import serve as ray_serve

from agentgym_rl.actors.chat import ChatFormat
from agentgym_rl.actors.engines import make_engine
from agentgym_rl.actors.engines.serving import choice_seed, seeded_generator
from agentgym_rl.actors.model_store import load_model, load_tokenizer
from agentgym_rl.actors.threads import capped
from agentgym_rl.actors.weight_sync import free_port
from agentgym_rl.actors.weights import pack_state_dict
from agentgym_rl.configs.schema import SamplingConfig, ServeConfig
from agentgym_rl.serve.app import ServeArgs, build_app, delete_app, start_server, stop_server
from agentgym_rl.serve.deployment import default_torch_threads
from agentgym_rl.serve.text import ReplyText

API_KEY = "test-key-123"
MAX_TOKENS = 64
MODEL = "iter_000003"
CHAT = [{"role": "user", "content": "Say hello."}]
ERROR_KEYS = {"message", "type", "param", "code"}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A checkpoint directory in the learner's layout: DIR/policy is a Hugging Face model dir."""
    folder = tmp_path_factory.mktemp("ckpt") / "iter_000003"
    load_model("tiny-random").save_pretrained(folder / "policy")
    load_tokenizer("tiny-random").save_pretrained(folder / "policy")
    return folder


@pytest.fixture(scope="module")
def server(ray_local, checkpoint):
    port = free_port()
    config = ServeConfig(
        port=port,
        api_key=API_KEY,
        max_tokens=MAX_TOKENS,
        max_prompt_tokens=200,
        max_body_bytes=4096,
        max_n=3,
        kv_cache_tokens=8192,
    )
    # float32: the seeded-replay tests compare served text with a local engine's, and bfloat16 CPU kernels are
    # not batch-invariant (a 32-stream batch and a lone request can round a near-tie apart).
    handle = start_server(ServeArgs(checkpoint=str(checkpoint), dtype="float32", serve=config))
    yield {"url": f"http://127.0.0.1:{port}", "handle": handle}
    stop_server()


def side_app(name: str, args: ServeArgs, server) -> str:
    """Run ``args`` as a second application on the same HTTP proxy under ``/name``; returns its URL."""
    ray_serve.run(build_app(args), name=name, route_prefix=f"/{name}")
    ray_serve.get_deployment_handle("PolicyModel", app_name=name).ready.remote().result(timeout_s=900)
    return f"{server['url']}/{name}"


@pytest.fixture(scope="module")
def busy(server, checkpoint):
    """An app with one row and no queue (a second request while one decodes gets 429), on two torch threads;
    its /v1/act parses for target-word alone."""
    config = ServeConfig(
        api_key=API_KEY,
        act_envs=["target-word"],
        torch_threads=2,
        max_batch_size=1,
        max_queued_requests=0,
        max_n=1,
        max_tokens=2000,
        max_prompt_tokens=200,
        kv_cache_tokens=4096,
    )
    yield side_app("busy", ServeArgs(checkpoint=str(checkpoint), app_name="busy", serve=config), server)
    delete_app("busy")


@pytest.fixture(scope="module")
def smol(server):
    """SmolLM2-135M, whose decode steps (not the HTTP round trips) dominate a 64-token reply's time."""
    config = ServeConfig(api_key=API_KEY, max_tokens=MAX_TOKENS)
    yield side_app("smol", ServeArgs(model="smollm2-135m-instruct", app_name="smol", serve=config), server)
    delete_app("smol")


@pytest.fixture()
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server["url"] + "/v1", api_key=API_KEY, max_retries=0)


def post(server, path: str, *, key: str | None = API_KEY, **kwargs) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    headers.update(kwargs.pop("headers", {}))
    return httpx.post(server["url"] + path, headers=headers, timeout=120, **kwargs)


def policy_info(url: str) -> dict:
    return httpx.get(url + "/v1/policy", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60).json()


def perturbed(seed: int) -> torch.nn.Module:
    model = load_model("tiny-random")
    with torch.no_grad():
        generator = torch.Generator().manual_seed(seed)
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.5)
    return model


def test_openai_client_non_streaming_and_streaming_agree(client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    # Temperature 0 is greedy decoding, so both modes must produce the same text.
    full = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=12, temperature=0)
    choice = full.choices[0]
    assert choice.finish_reason in ("stop", "length")
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.logprobs is None
    assert full.usage.completion_tokens <= 12 and full.usage.prompt_tokens > 0
    assert full.system_fingerprint == f"weights-v{full.weights_version}"

    stream = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=12, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == choice.finish_reason
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert {c.weights_version for c in chunks} == {full.weights_version}


def test_raw_stream_is_server_sent_events(server):
    body = {"model": MODEL, "messages": CHAT, "max_tokens": 4, "stream": True}
    with httpx.stream(
        "POST", server["url"] + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {API_KEY}"}
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"


COUNT = [{"role": "user", "content": "Count from 1 to 100, separated by commas."}]
STREAM_64 = {
    "model": "smollm2-135m-instruct",
    "messages": COUNT,
    "max_tokens": 64,
    "temperature": 0,
    "stream": True,
    "stream_options": {"include_usage": True},
}


class Timing:
    """Arrival time of the first content chunk and of the end of a stream, from ``started``."""

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.first: float | None = None
        self.content_chunks = 0
        self.last = None

    def see(self, chunk) -> None:
        if chunk.choices and chunk.choices[0].delta.content:
            self.content_chunks += 1
            if self.first is None:
                self.first = time.perf_counter() - self.started
        self.last = chunk

    def end(self) -> float:
        return time.perf_counter() - self.started


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_streamed_tokens_arrive_as_they_are_sampled(smol, mode):
    """64 tokens streamed: the first content chunk comes before a quarter of the whole reply's time."""
    if mode == "sync":
        client = openai.OpenAI(base_url=smol + "/v1", api_key=API_KEY, max_retries=0)
        timing = Timing()
        for chunk in client.chat.completions.create(**STREAM_64):
            timing.see(chunk)
        total = timing.end()
    else:

        async def read() -> tuple[Timing, float]:
            client = openai.AsyncOpenAI(base_url=smol + "/v1", api_key=API_KEY, max_retries=0)
            timing = Timing()
            async for chunk in await client.chat.completions.create(**STREAM_64):
                timing.see(chunk)
            return timing, timing.end()

        timing, total = asyncio.run(read())
    assert timing.last.usage.completion_tokens == 64
    assert timing.content_chunks > 8, timing.content_chunks
    assert timing.first < total / 4, (timing.first, total)


def test_stop_ends_the_text_before_the_stop_string(client):
    def sample(**stop):
        return client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=24, seed=3, **stop)

    text = sample().choices[0].message.content
    # Two ASCII letters from the later part of the reply (a seeded reply is the same every time).
    stop = next(
        text[i : i + 2]
        for i in range(len(text) // 3, len(text) - 1)
        if text[i : i + 2].isascii() and text[i : i + 2].isalnum()
    )
    expected = text[: text.index(stop)]
    for given in (stop, ["never-sampled-zzz", stop]):
        cut = sample(stop=given)
        assert cut.choices[0].message.content == expected
        assert cut.choices[0].finish_reason == "stop"
    chunks = list(sample(stop=stop, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_seed_reproduces_a_sampled_completion(client):
    def sample(seed: int) -> str:
        reply = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=16, temperature=1.0, seed=seed)
        return reply.choices[0].message.content

    assert sample(123) == sample(123)
    assert sample(123) != sample(124)


def test_a_developer_message_is_read_as_the_system_prompt(client):
    def reply(role: str, seed: int = 5):
        messages = [{"role": role, "content": "Answer in one word."}, *CHAT]
        return client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, seed=seed)

    as_developer, as_system = reply("developer"), reply("system")
    assert as_developer.choices[0].message.content == as_system.choices[0].message.content
    assert as_developer.usage.prompt_tokens == as_system.usage.prompt_tokens
    # as a user turn the same text is no system prompt: the chat template adds its default one
    assert reply("user").usage.prompt_tokens != as_system.usage.prompt_tokens


def test_n_choices_in_one_response_and_one_stream(client):
    reply = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=8, n=3, seed=5)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert len({c.message.content for c in reply.choices}) > 1  # each choice samples from its own stream
    stream = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=8, n=3, seed=5, stream=True)
    texts, finished = {0: "", 1: "", 2: ""}, set()
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finished.add(choice.index)
    assert finished == {0, 1, 2}
    assert texts == {c.index: c.message.content for c in reply.choices}


def test_logprobs_and_top_logprobs(client):
    reply = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=6, seed=9, logprobs=True, top_logprobs=3
    )
    choice = reply.choices[0]
    content = choice.logprobs.content
    assert len(content) == reply.usage.completion_tokens - (choice.finish_reason == "stop")
    assert "".join(entry.token for entry in content) == choice.message.content
    for entry in content:
        assert bytes(entry.bytes).decode(errors="replace") == entry.token
        tops = [top.logprob for top in entry.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True)
        assert entry.logprob <= tops[0] + 1e-5
    streamed = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=6, seed=9, logprobs=True, top_logprobs=3, stream=True
    )
    entries = [
        entry
        for chunk in streamed
        if chunk.choices and chunk.choices[0].logprobs
        for entry in chunk.choices[0].logprobs.content
    ]
    assert [(e.token, round(e.logprob, 4)) for e in entries] == [(e.token, round(e.logprob, 4)) for e in content]


def test_legacy_completions_continue_the_raw_prompt_with_logprobs_echo_and_streaming(client, checkpoint):
    prompt = "The red ball is next to"
    ids = load_tokenizer(str(checkpoint / "policy")).encode(prompt)
    ask = {"model": MODEL, "max_tokens": 6, "seed": 9}
    reply = client.completions.create(prompt=prompt, logprobs=3, **ask)
    [choice] = reply.choices
    assert reply.object == "text_completion" and reply.usage.prompt_tokens == len(ids)  # no chat template
    logprobs = choice.logprobs
    assert len(logprobs.tokens) == reply.usage.completion_tokens - (choice.finish_reason == "stop")
    assert "".join(logprobs.tokens) == choice.text
    assert logprobs.text_offset == [sum(len(t) for t in logprobs.tokens[:i]) for i in range(len(logprobs.tokens))]
    for value, tops in zip(logprobs.token_logprobs, logprobs.top_logprobs, strict=True):
        assert 1 <= len(tops) <= 3 and value <= max(tops.values()) + 1e-5
    # the same prompt as token ids, the same seed: the same completion; echo puts the prompt first
    assert client.completions.create(prompt=ids, **ask).choices[0].text == choice.text
    echoed = client.completions.create(prompt=prompt, echo=True, **ask).choices[0]
    assert echoed.text == prompt + choice.text
    streamed = client.completions.create(
        prompt=prompt, logprobs=3, stream=True, stream_options={"include_usage": True}, **ask
    )
    chunks = list(streamed)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == choice.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == choice.finish_reason
    tokens = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert tokens == logprobs.tokens and chunks[-1].usage.completion_tokens == reply.usage.completion_tokens
    several = client.completions.create(prompt=prompt, n=3, **ask)
    assert [c.index for c in several.choices] == [0, 1, 2] and len({c.text for c in several.choices}) > 1
    refused = {
        "prompt's own log-probabilities": {"prompt": prompt, "echo": True, "logprobs": 1},
        "one prompt per request": {"prompt": [prompt, prompt]},
        "outside the vocabulary": {"prompt": [10**7]},
        "suffix": {"prompt": prompt, "extra_body": {"suffix": "x"}},
    }
    for says, body in refused.items():
        with pytest.raises(openai.BadRequestError, match=says):
            client.completions.create(**{**ask, **body})
    with pytest.raises(openai.NotFoundError):
        client.completions.create(**{**ask, "model": "gpt-3.5-turbo-instruct", "prompt": prompt})


def test_presence_and_frequency_penalties_stop_repetition(client):
    def greedy_tokens(**penalties) -> list[str]:
        reply = client.chat.completions.create(
            model=MODEL, messages=CHAT, max_tokens=24, temperature=0, logprobs=True, **penalties
        )
        return [entry.token for entry in reply.choices[0].logprobs.content]

    plain = greedy_tokens()
    assert len(set(plain)) < len(plain)  # tiny-random's greedy reply repeats itself
    for penalties in ({"presence_penalty": 2.0}, {"frequency_penalty": 2.0}):
        penalised = greedy_tokens(**penalties)
        assert len(set(penalised)) == len(penalised), penalties


def test_max_completion_tokens_user_and_unknown_fields(client):
    reply = client.chat.completions.create(model=MODEL, messages=CHAT, max_completion_tokens=5, seed=1, user="alice")
    assert reply.usage.completion_tokens == 5 and reply.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError, match="unrecognized request argument supplied: logit_bias") as info:
        client.chat.completions.create(model=MODEL, messages=CHAT, extra_body={"logit_bias": {"42": 5}})
    assert info.value.body["param"] == "logit_bias"


def test_api_key_required(server, client):
    assert post(server, "/v1/chat/completions", key=None, json={}).status_code == 401
    assert post(server, "/v1/chat/completions", key="wrong", json={}).status_code == 401
    assert httpx.get(server["url"] + "/v1/models").status_code == 401
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server["url"] + "/v1", api_key="wrong", max_retries=0).models.list()
    ok = httpx.get(server["url"] + "/v1/models", headers={"Authorization": f"Bearer {API_KEY}"})
    assert ok.status_code == 200
    assert httpx.get(server["url"] + "/healthz").status_code == 200


USER = b'"messages": [{"role": "user", "content": "x"}]'


@pytest.mark.parametrize(
    ("path", "body", "key", "status", "param", "says"),
    [
        ("/v1/chat/completions", b'{"model": "iter_000003", "messages": [', API_KEY, 400, None, "not valid JSON"),
        ("/v1/chat/completions", b'{"model": 7, "messages": "hi"}', API_KEY, 400, "model", "model"),
        (
            "/v1/chat/completions",
            b'{"model": "iter_000003", "messages": [{"role": "robot", "content": "x"}]}',
            API_KEY,
            400,
            "messages.0.role",
            "role",
        ),
        (
            "/v1/chat/completions",
            b'{"model": "iter_000003", ' + USER + b', "bogus": 1}',
            API_KEY,
            400,
            "bogus",
            "unrecognized request argument supplied: bogus",
        ),
        (
            "/v1/chat/completions",
            b'{"model": "iter_000003", ' + USER + b', "max_tokens": 100000}',
            API_KEY,
            400,
            "max_tokens",
            "max_tokens cap of 64",
        ),
        ("/v1/chat/completions", b'{"model": "iter_000003", ' + USER + b', "n": 4}', API_KEY, 400, "n", "serve.max_n"),
        (
            "/v1/chat/completions",
            b'{"model": "iter_000003", ' + USER + b', "top_logprobs": 2}',
            API_KEY,
            400,
            None,
            "top_logprobs needs logprobs",
        ),
        (
            "/v1/chat/completions",
            b'{"model": "iter_000003", ' + USER + b', "stop": ["a", "b", "c", "d", "e"]}',
            API_KEY,
            400,
            "stop",
            "at most 4",
        ),
        (
            "/v1/chat/completions",
            b'{"model": "iter_000003", ' + USER + b', "temperature": 3}',
            API_KEY,
            400,
            "temperature",
            "temperature",
        ),
        ("/v1/chat/completions", b"{}", None, 401, None, "API key"),
        ("/v1/chat/completions", b"{}", "wrong", 401, None, "API key"),
        ("/v1/chat/completions", b'{"model": "other", ' + USER + b"}", API_KEY, 404, "model", "iter_000003"),
        ("/v1/act", b'{"env": "no-such-env", "observation": "x"}', API_KEY, 404, "env", "babyai"),
        ("/v1/nowhere", b"{}", API_KEY, 404, None, "/v1/chat/completions"),
        (
            "/v1/chat/completions",
            b'{"model": "iter_000003", "messages": [{"role": "user", "content": "' + b"x" * 5000 + b'"}]}',
            API_KEY,
            413,
            None,
            "4096",
        ),
    ],
)
def test_every_4xx_has_openais_error_shape(server, path, body, key, status, param, says):
    response = post(server, path, key=key, content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(response.json()) == {"error"} and set(error) == ERROR_KEYS
    assert says in error["message"] and error["param"] == param and isinstance(error["type"], str)


def test_the_openai_client_raises_its_own_exception_for_each_status(server, client):
    cases = [
        (openai.BadRequestError, {"max_tokens": 10_000}, "max_tokens cap of 64"),
        (openai.BadRequestError, {"n": 4}, "cap of 3"),
        (openai.NotFoundError, {"model": "other"}, "iter_000003"),
    ]
    for exception, change, says in cases:
        with pytest.raises(exception, match=says):
            client.chat.completions.create(**{"model": MODEL, "messages": CHAT, **change})
    with pytest.raises(openai.AuthenticationError, match="API key"):
        openai.OpenAI(base_url=server["url"] + "/v1", api_key="wrong", max_retries=0).chat.completions.create(
            model=MODEL, messages=CHAT
        )
    with pytest.raises(openai.APIStatusError, match="4096") as info:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x" * 5000}])
    assert info.value.status_code == 413


def test_long_prompt_is_refused_naming_the_limit(server):
    long_prompt = {"model": MODEL, "messages": [{"role": "user", "content": "hello " * 300}]}
    response = post(server, "/v1/chat/completions", json=long_prompt)
    assert response.status_code == 400 and "max_prompt_tokens is 200" in response.json()["error"]["message"]


def test_a_disconnected_client_frees_its_row_at_once_and_a_full_replica_answers_429(busy, server):
    replica = policy_info(busy)
    before = replica["stats"]
    default = policy_info(server["url"])["torch_threads"]
    assert replica["torch_threads"] == 2 and default == capped(default_torch_threads(os.cpu_count()))
    body = {"model": MODEL, "messages": CHAT, "max_tokens": 2000, "stream": True}
    client = openai.OpenAI(base_url=busy + "/v1", api_key=API_KEY, max_retries=0)
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.stream("POST", busy + "/v1/chat/completions", json=body, headers=headers, timeout=120) as response:
        lines = response.iter_lines()
        while '"content":""' in (line := next(lines)) or not line:
            pass  # the role chunk; the next one carries sampled text
        # The replica's only row is taken and it queues nothing: the next request is refused.
        with pytest.raises(openai.RateLimitError, match="server busy") as info:
            client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4)
        assert set(info.value.body) == ERROR_KEYS and info.value.body["code"] == "rate_limit_exceeded"
        assert info.value.response.headers["retry-after"] == "1"
    # The client went away: its row leaves the batch at the replica's next step.
    deadline = time.monotonic() + 120
    while (stats := policy_info(busy)["stats"])["in_flight"] or stats["decoding_rows"]:
        assert time.monotonic() < deadline, stats
        time.sleep(0.1)
    assert stats["abandoned"] == before["abandoned"] + 1
    assert stats["generated_tokens"] - before["generated_tokens"] < 2000
    assert client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4).choices[0].message.content


def test_act_parses_with_the_env_parser(server):
    body = {"env": "babyai", "observation": "Your goal: go to the red ball", "max_tokens": 8, "temperature": 0}
    response = post(server, "/v1/act", json=body)
    assert response.status_code == 200, response.text
    act = response.json()
    assert act["completion"]
    # tiny-random writes noise, so the babyai parser finds no "Action:" line and says so.
    assert act["action"] is None and "Action:" in act["invalid_reason"]
    system = {"env": "babyai", "observation": "x", "history": [{"role": "system", "content": "x"}]}
    assert post(server, "/v1/act", json=system).status_code == 400


def test_act_parses_only_for_the_envs_the_endpoint_lists(busy):
    body = {"observation": "Guess the word.", "max_tokens": 4, "temperature": 0}
    listed = post({"url": busy}, "/v1/act", json={**body, "env": "target-word"})
    assert listed.status_code == 200, listed.text
    assert listed.json()["completion"]
    refused = post({"url": busy}, "/v1/act", json={**body, "env": "babyai"})
    assert refused.status_code == 404, refused.text
    error = refused.json()["error"]
    assert error["param"] == "env" and error["code"] == "env_not_found"
    assert "serve.act_envs" in error["message"] and "target-word" in error["message"]


def test_an_endpoint_listing_an_unregistered_env_for_act_is_refused_before_it_starts(checkpoint):
    serve = ServeConfig(act_envs=["babyai", "no-such-env"])
    with pytest.raises(ValueError, match="no-such-env"):
        build_app(ServeArgs(checkpoint=str(checkpoint), serve=serve))


def test_hot_swap_during_requests(server, client):
    policy = policy_info(server["url"])
    before = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=12, temperature=0)
    version = policy["weights_version"] + 5
    errors: list[BaseException] = []
    done = threading.Semaphore(0)
    stop = threading.Event()

    def traffic() -> None:
        while not stop.is_set():
            try:
                client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=6)
                done.release()
            except Exception as exc:  # noqa: BLE001 -- every failure counts; the swap must not break requests
                errors.append(exc)
                return

    threads = [threading.Thread(target=traffic) for _ in range(4)]
    for thread in threads:
        thread.start()
    for _ in range(4):  # requests are flowing before the swap ...
        assert done.acquire(timeout=120)
    ref = ray.put(pack_state_dict(perturbed(0).state_dict(), version))
    loaded = server["handle"].update_weights.remote([ref], 41).result()
    for _ in range(4):  # ... and after it
        assert done.acquire(timeout=120)
    stop.set()
    for thread in threads:
        thread.join()

    assert loaded == version
    assert errors == []
    after_policy = policy_info(server["url"])
    assert after_policy["weights_version"] == version and after_policy["iteration"] == 41
    assert after_policy["source"].endswith("policy") and after_policy["engine"] == "transformers"
    after = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=12, temperature=0)
    assert after.choices[0].message.content != before.choices[0].message.content
    assert (before.weights_version, after.weights_version) == (policy["weights_version"], version)


TEMPERATURES = (0.0, 0.5, 1.0, 1.5)
STOPS = (None, "e", [" a", "."], "\n")


def spec(index: int) -> dict:
    """Request ``index`` of the concurrent test: its own temperature, stop, max_tokens, seed and prompt."""
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"Request {index}: tell me something."}],
        "temperature": TEMPERATURES[index % 4],
        "stop": STOPS[(index // 4) % 4],
        "max_tokens": 4 + (index * 7) % 40,
        "seed": 1000 + index,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def expected(engine, chat: ChatFormat, request: dict) -> tuple[str, int, str]:
    """Text, token count and finish reason the sampler's engine gives ``request`` alone (same weights,
    same seeded stream)."""
    greedy = request["temperature"] == 0.0
    stops = [request["stop"]] if isinstance(request["stop"], str) else request["stop"] or []
    sampling = SamplingConfig(
        temperature=1.0 if greedy else request["temperature"],
        top_k=1 if greedy else 0,
        max_new_tokens=request["max_tokens"],
        stop=stops,
    )
    generator = seeded_generator(choice_seed(request["seed"], 0))
    generation = engine.generate([chat.prompt_ids(request["messages"])], sampling, [generator])[0]
    reply = ReplyText(chat.decode_reply, stops)
    reply.push(generation.token_ids)
    return reply.text, len(generation.token_ids), generation.finish_reason


def test_32_concurrent_streams_complete_correctly_across_a_weight_swap(server, checkpoint):
    """32 streamed requests with different temperatures, stops and max_tokens while the weights change:
    each reports one weights version on every chunk and its text is exactly what that version samples."""
    handle, url = server["handle"], server["url"]
    version_a = policy_info(url)["weights_version"] + 1
    version_b = version_a + 1
    weights = {version_a: perturbed(1).state_dict(), version_b: perturbed(2).state_dict()}
    handle.update_weights.remote([ray.put(pack_state_dict(weights[version_a], version_a))], 50).result()
    ref_b = ray.put(pack_state_dict(weights[version_b], version_b))

    async def stream(client: openai.AsyncOpenAI, index: int, started: asyncio.Event | None) -> dict:
        text, versions, finish, usage = "", set(), None, None
        async for chunk in await client.chat.completions.create(**spec(index)):
            versions.add(chunk.weights_version)
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                text += choice.delta.content or ""
                finish = choice.finish_reason or finish
                if choice.delta.content and started is not None:
                    started.set()
        return {"index": index, "text": text, "versions": versions, "finish": finish, "usage": usage}

    async def swap_when_streaming(first_wave: list[asyncio.Event]) -> asyncio.Task:
        while sum(event.is_set() for event in first_wave) < 8:
            await asyncio.sleep(0.01)
        update = asyncio.create_task(asyncio.to_thread(handle.update_weights.remote([ref_b], 51).result))
        while not (await asyncio.to_thread(policy_info, url))["stats"]["swap_pending"] and not update.done():
            await asyncio.sleep(0.01)
        return update

    async def main() -> list[dict]:
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0, timeout=600)
        first_wave = [asyncio.Event() for _ in range(16)]
        early = [asyncio.create_task(stream(client, i, first_wave[i])) for i in range(16)]
        update = await swap_when_streaming(first_wave)
        # Asked for while the swap waits for the first wave: these run on the new weights.
        late = [asyncio.create_task(stream(client, i, None)) for i in range(16, 32)]
        results = await asyncio.gather(*early, *late)
        assert await update == version_b
        return results

    results = asyncio.run(main())
    chat = ChatFormat(load_tokenizer(str(checkpoint / "policy")))
    engines = {}
    for version, state in weights.items():
        engines[version] = make_engine(
            "transformers",
            model_name=str(checkpoint / "policy"),
            dtype="float32",
            seed=0,
            stop_token_ids=[chat.tokenizer.eos_token_id],
            pad_token_id=chat.tokenizer.pad_token_id,
        )
        engines[version].load_weights(pack_state_dict(state, version))
    seen = set()
    for result in results:
        request = spec(result["index"])
        assert len(result["versions"]) == 1, result  # one version on every chunk of a completion
        (version,) = result["versions"]
        seen.add(version)
        text, sampled, finish = expected(engines[version], chat, request)
        assert (result["text"], result["finish"]) == (text, finish), (result, request)
        assert result["usage"].completion_tokens == sampled <= request["max_tokens"]
    assert seen == {version_a, version_b}
    assert all(r["versions"] == {version_b} for r in results[16:])


def test_config_contradictions_are_errors(checkpoint):
    with pytest.raises(ValidationError, match="not both"):
        ServeConfig(num_replicas=2, autoscaling={"min_replicas": 1, "max_replicas": 2})
    with pytest.raises(ValidationError, match="exceeds max_replicas"):
        ServeConfig(autoscaling={"min_replicas": 3, "max_replicas": 2})
    with pytest.raises(ValidationError, match="exactly one"):
        ServeArgs(checkpoint=str(checkpoint), model="tiny-random")
    with pytest.raises(ValidationError, match="config.json"):
        ServeArgs(checkpoint=str(checkpoint.parent))


def test_a_run_directory_serves_its_latest_complete_checkpoint(checkpoint, tmp_path: Path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("run: {name: run}\n")
    with pytest.raises(ValidationError, match="run directory without a complete checkpoint"):
        ServeArgs(checkpoint=str(run))
    for name in ("iter_000002", "iter_000004", "iter_000006"):
        shutil.copytree(checkpoint / "policy", run / "checkpoints" / name / "policy")
    for name in ("iter_000002", "iter_000004"):  # iter_000006 has no trainer state: it was never completed
        (run / "checkpoints" / name / "trainer.json").write_text("{}")
    assert ServeArgs(checkpoint=str(run)).source == str(run / "checkpoints" / "iter_000004" / "policy")


def test_update_reaches_every_replica(server, checkpoint):
    """One update_weights call (Serve routes it to one replica) reaches both replicas through the store."""
    args = ServeArgs(checkpoint=str(checkpoint), app_name="two-replicas", serve=ServeConfig(num_replicas=2))
    ray_serve.run(build_app(args), name="two-replicas", route_prefix="/two")
    handle = ray_serve.get_deployment_handle("PolicyModel", app_name="two-replicas")
    try:
        model = load_model("tiny-random")
        ref = ray.put(pack_state_dict(model.state_dict(), 9))
        assert handle.update_weights.remote([ref], 8).result() == 9
        seen: dict[str, int] = {}
        for _ in range(200):
            info = handle.policy.remote().result()
            seen[info["replica"]] = info["weights_version"]
            if len(seen) == 2:
                break
        assert len(seen) == 2 and set(seen.values()) == {9}, seen
    finally:
        delete_app("two-replicas")


@pytest.mark.slow  # about 5 min of vLLM's CPU build beside other tests: in the slow tier's rotation
@pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="needs the vLLM engine (./install.sh --vllm or --dev)"
)
def test_the_vllm_engine_behind_the_endpoint_streams_reproduces_seeds_and_swaps_weights(server, checkpoint):
    config = ServeConfig(api_key=API_KEY, engine="vllm", max_tokens=MAX_TOKENS, max_n=2)
    args = ServeArgs(checkpoint=str(checkpoint), app_name="vllm", serve=config)
    url = side_app("vllm", args, server)
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0)
        request = {"model": MODEL, "messages": CHAT, "max_tokens": 12, "temperature": 1.0, "seed": 7}
        first = client.chat.completions.create(**request)
        again = client.chat.completions.create(**request)
        assert first.choices[0].message.content == again.choices[0].message.content  # the seed fixes the sample
        assert first.usage.completion_tokens == 12 and first.choices[0].finish_reason == "length"
        chunks = list(client.chat.completions.create(**request, stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
            first.choices[0].message.content
        )
        assert policy_info(url)["engine"] == "vllm"

        greedy = {"model": MODEL, "messages": CHAT, "max_tokens": 12, "temperature": 0}
        before = client.chat.completions.create(**greedy)
        handle = ray_serve.get_deployment_handle("PolicyModel", app_name="vllm")
        ref = ray.put(pack_state_dict(perturbed(0).state_dict(), 17))
        assert handle.update_weights.remote([ref], 16).result() == 17
        after = client.chat.completions.create(**greedy)
        assert after.choices[0].message.content != before.choices[0].message.content
        assert after.weights_version == 17 and policy_info(url)["weights_version"] == 17
    finally:
        delete_app("vllm")


def test_a_lora_checkpoint_serves_its_adapter_and_hot_swaps_adapter_versions(server, tmp_path_factory):
    """An app started from a LoRA checkpoint serves base + adapter, and each adapter-only version it is sent
    answers what the learner's merged weights answer (greedy, the engine's own reference)."""
    from tests.unit.learner.helpers import batch_of
    from tests.unit.learner.test_learner import make_learner

    learner = make_learner(
        "sft", "learner.lora.enabled=true", "learner.lora.target_modules=all-linear", "learner.lr=2e-2"
    )
    learner.update_batch(batch_of(seed=1))
    folder = tmp_path_factory.mktemp("lora") / "iter_000001"
    learner.save_checkpoint(str(folder))
    config = ServeConfig(api_key=API_KEY, max_tokens=MAX_TOKENS)
    args = ServeArgs(checkpoint=str(folder), app_name="lora", dtype="float32", serve=config)
    url = side_app("lora", args, server)
    chat = ChatFormat(load_tokenizer("tiny-random"))
    reference = make_engine(
        "transformers", model_name="tiny-random", dtype="float32", seed=0, stop_token_ids=[chat.tokenizer.eos_token_id],
        pad_token_id=chat.tokenizer.pad_token_id,
    )  # fmt: skip
    client = openai.OpenAI(base_url=url + "/v1", api_key=API_KEY, max_retries=0)
    request = {**spec(0), "model": "iter_000001", "temperature": 0.0, "stream": False, "max_tokens": 16}
    request.pop("stream_options")
    texts = []
    try:
        for version in (None, 7, 8):
            if version is not None:
                learner.update_batch(batch_of(seed=version))
                payload = learner.weights_payload()
                payload = type(payload)(version, payload.arrays, payload.dtypes, payload.lora_scale)
                handle = ray_serve.get_deployment_handle("PolicyModel", app_name="lora")
                assert handle.update_weights.remote([ray.put(payload)], version).result() == version
            reference.load_weights(pack_state_dict(learner.policy_state_dict(), version or 0, dtype="float32"))
            text, tokens, _ = expected(reference, chat, request)
            reply = client.chat.completions.create(**request)
            assert reply.choices[0].message.content == text and reply.usage.completion_tokens == tokens, version
            assert policy_info(url)["weights_version"] == (version or 0)
            texts.append(text)
    finally:
        delete_app("lora")
    assert len(set(texts)) > 1  # the versions answer differently: the adapters reached the replica

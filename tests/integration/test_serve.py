"""The Ray Serve policy endpoint on local Ray, over real HTTP on 127.0.0.1, with the openai client."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import openai
import pytest
import ray
import torch
from pydantic import ValidationError
from ray import serve as ray_serve

from actors.models import load_model, load_tokenizer
from actors.trainer import free_port
from actors.weights import pack_state_dict
from configs.schema import ServeConfig
from serve.app import ServeArgs, build_app, delete_app, start_server, stop_server

API_KEY = "test-key-123"
MAX_TOKENS = 24


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
    config = ServeConfig(port=port, api_key=API_KEY, max_tokens=MAX_TOKENS, max_prompt_tokens=200, max_body_bytes=4096)
    handle = start_server(ServeArgs(checkpoint=str(checkpoint), serve=config))
    yield {"url": f"http://127.0.0.1:{port}", "handle": handle}
    stop_server()


@pytest.fixture()
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server["url"] + "/v1", api_key=API_KEY, max_retries=0)


def post(server, path: str, *, key: str | None = API_KEY, **kwargs) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    headers.update(kwargs.pop("headers", {}))
    return httpx.post(server["url"] + path, headers=headers, timeout=60, **kwargs)


CHAT = [{"role": "user", "content": "Say hello."}]


def test_openai_client_non_streaming_and_streaming_agree(client):
    assert [m.id for m in client.models.list().data] == ["iter_000003"]
    # Temperature 0 is greedy decoding, so both modes must produce the same text.
    full = client.chat.completions.create(model="iter_000003", messages=CHAT, max_tokens=12, temperature=0)
    choice = full.choices[0]
    assert choice.finish_reason in ("stop", "length")
    assert choice.message.role == "assistant" and choice.message.content
    assert full.usage.completion_tokens <= 12 and full.usage.prompt_tokens > 0

    stream = client.chat.completions.create(
        model="iter_000003",
        messages=CHAT,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == choice.finish_reason
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens


def test_raw_stream_is_server_sent_events(server):
    body = {"model": "iter_000003", "messages": CHAT, "max_tokens": 4, "stream": True}
    with httpx.stream(
        "POST", server["url"] + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {API_KEY}"}
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"


def test_api_key_required(server, client):
    assert post(server, "/v1/chat/completions", key=None, json={}).status_code == 401
    assert post(server, "/v1/chat/completions", key="wrong", json={}).status_code == 401
    assert httpx.get(server["url"] + "/v1/models").status_code == 401
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server["url"] + "/v1", api_key="wrong", max_retries=0).models.list()
    ok = httpx.get(server["url"] + "/v1/models", headers={"Authorization": f"Bearer {API_KEY}"})
    assert ok.status_code == 200
    assert httpx.get(server["url"] + "/healthz").status_code == 200


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        (b'{"model": "iter_000003", "messages": [', 422, "JSON"),
        (b'{"model": 7, "messages": "hi"}', 422, "model"),
        (b'{"model": "iter_000003", "messages": [{"role": "robot", "content": "x"}]}', 422, "role"),
        (b'{"model": "iter_000003", "messages": [], "bogus": 1}', 422, "bogus"),
        (b'{"model": "iter_000003", "messages": [{"role": "user", "content": "x"}], "max_tokens": 100000}', 400, "24"),
        (b'{"model": "other", "messages": [{"role": "user", "content": "x"}]}', 404, "iter_000003"),
        (
            b'{"model": "iter_000003", "messages": [{"role": "user", "content": "x"}], "n": 3}',
            422,
            "n: Input should be less than or equal to 1",
        ),
    ],
)
def test_bad_chat_requests_get_4xx(server, body, status, says):
    response = post(server, "/v1/chat/completions", content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == status, response.text
    assert says in response.json()["error"]["message"]


def test_oversized_body_and_long_prompt(server):
    huge = {"model": "iter_000003", "messages": [{"role": "user", "content": "x" * 10_000}]}
    response = post(server, "/v1/chat/completions", json=huge)
    assert response.status_code == 413 and "4096" in response.json()["error"]["message"]
    long_prompt = {"model": "iter_000003", "messages": [{"role": "user", "content": "hello " * 300}]}
    response = post(server, "/v1/chat/completions", json=long_prompt)
    assert response.status_code == 400 and "max_prompt_tokens is 200" in response.json()["error"]["message"]


def test_openai_client_raises_on_huge_max_tokens(client):
    with pytest.raises(openai.BadRequestError, match="max_tokens cap of 24"):
        client.chat.completions.create(model="iter_000003", messages=CHAT, max_tokens=10_000)


def test_act_parses_with_the_env_parser(server):
    body = {"env": "babyai", "observation": "Your goal: go to the red ball", "max_tokens": 8, "temperature": 0}
    response = post(server, "/v1/act", json=body)
    assert response.status_code == 200, response.text
    act = response.json()
    assert act["completion"]
    # tiny-random writes noise, so the babyai parser finds no "Action:" line and says so.
    assert act["action"] is None and "Action:" in act["invalid_reason"]

    unknown = post(server, "/v1/act", json={"env": "no-such-env", "observation": "x"})
    assert unknown.status_code == 404 and "babyai" in unknown.json()["error"]["message"]
    system = {"env": "babyai", "observation": "x", "history": [{"role": "system", "content": "x"}]}
    assert post(server, "/v1/act", json=system).status_code == 422


def test_hot_swap_during_requests(server, client):
    policy = httpx.get(server["url"] + "/v1/policy", headers={"Authorization": f"Bearer {API_KEY}"}).json()
    before = client.chat.completions.create(model="iter_000003", messages=CHAT, max_tokens=12, temperature=0)

    model = load_model("tiny-random")
    with torch.no_grad():
        generator = torch.Generator().manual_seed(0)
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.5)
    version = policy["weights_version"] + 5
    errors: list[BaseException] = []
    done = threading.Semaphore(0)
    stop = threading.Event()

    def traffic() -> None:
        while not stop.is_set():
            try:
                client.chat.completions.create(model="iter_000003", messages=CHAT, max_tokens=6)
                done.release()
            except Exception as exc:  # every failure counts; the swap must not break requests
                errors.append(exc)
                return

    threads = [threading.Thread(target=traffic) for _ in range(4)]
    for thread in threads:
        thread.start()
    for _ in range(4):  # requests are flowing before the swap ...
        assert done.acquire(timeout=120)
    ref = ray.put(pack_state_dict(model.state_dict(), version))
    loaded = server["handle"].update_weights.remote([ref], 41).result()
    for _ in range(4):  # ... and after it
        assert done.acquire(timeout=120)
    stop.set()
    for thread in threads:
        thread.join()

    assert loaded == version
    assert errors == []
    after_policy = httpx.get(server["url"] + "/v1/policy", headers={"Authorization": f"Bearer {API_KEY}"}).json()
    assert after_policy["weights_version"] == version and after_policy["iteration"] == 41
    assert after_policy["source"].endswith("policy")
    after = client.chat.completions.create(model="iter_000003", messages=CHAT, max_tokens=12, temperature=0)
    assert after.choices[0].message.content != before.choices[0].message.content


def test_config_contradictions_are_errors(checkpoint):
    with pytest.raises(ValidationError, match="not both"):
        ServeConfig(num_replicas=2, autoscaling={"min_replicas": 1, "max_replicas": 2})
    with pytest.raises(ValidationError, match="exceeds max_replicas"):
        ServeConfig(autoscaling={"min_replicas": 3, "max_replicas": 2})
    with pytest.raises(ValidationError, match="exactly one"):
        ServeArgs(checkpoint=str(checkpoint), model="tiny-random")
    with pytest.raises(ValidationError, match="config.json"):
        ServeArgs(checkpoint=str(checkpoint.parent))


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

"""A client of the served policy, with the official `openai` package: `python docs/examples/serve_client.py`.

With `--base-url` it talks to a server that is already up (`agentgym-rl serve --checkpoint runs/NAME/checkpoints/iter_N`, or a
training run with `serve.enabled: true`); without, it starts `agentgym-rl serve --model tiny-random` on a free
port of 127.0.0.1 for the length of the script. It lists the models, asks for a chat completion (the same
seed twice gives the same reply), streams one, asks `/v1/act` for a BabyAI action and reads which weights
version answered from `/v1/policy`.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from openai import OpenAI


@contextlib.contextmanager
def local_server(model: str) -> Iterator[str]:
    """`agentgym-rl serve --model MODEL` on a free port; its base URL once /healthz answers."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [str(Path(sys.executable).parent / "agentgym-rl"), "serve", "--model", model, "--port", str(port)]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while True:
            if server.poll() is not None:
                raise RuntimeError(f"agentgym-rl serve exited with {server.returncode}: {server.stderr.read()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/healthz", timeout=5).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError("the server did not answer /healthz within 600 s")
            time.sleep(2)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=120)


def use(base_url: str, api_key: str) -> None:
    client = OpenAI(base_url=f"{base_url}/v1", api_key=api_key)
    [model] = [m.id for m in client.models.list()]
    print(f"model: {model}")

    messages = [{"role": "user", "content": "Name a colour."}]
    replies = [client.chat.completions.create(model=model, messages=messages, max_tokens=12, seed=7) for _ in range(2)]
    texts = [r.choices[0].message.content for r in replies]
    print(f"reply (seed 7, twice): {texts[0]!r}")
    assert texts[0] == texts[1], "the same seed must give the same completion"
    assert replies[0].usage.completion_tokens <= 12

    stream = client.chat.completions.create(model=model, messages=messages, max_tokens=12, seed=7, stream=True)
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert streamed == texts[0], "a streamed completion with the same seed is the same text"

    headers = {"Authorization": f"Bearer {api_key}"}
    act = httpx.post(
        f"{base_url}/v1/act",
        json={"env": "babyai", "observation": "You see a red ball 2 steps ahead.", "max_tokens": 24, "seed": 1},
        headers=headers,
        timeout=120,
    ).json()
    print(f"/v1/act: action {act['action']!r} (invalid: {act['invalid_reason']!r})")
    assert (act["action"] is None) != (act["invalid_reason"] is None)

    policy = httpx.get(f"{base_url}/v1/policy", headers=headers, timeout=30).json()
    print(f"/v1/policy: {policy['source']} at weights version {policy['weights_version']} ({policy['engine']})")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", help="a running server, e.g. http://127.0.0.1:8000 (default: start one)")
    parser.add_argument("--api-key", default="none", help="the server's --api-key, if it has one")
    parser.add_argument("--model", default="tiny-random", help="model of the server this script starts")
    args = parser.parse_args(argv)
    if args.base_url:
        use(args.base_url, args.api_key)
    else:
        with local_server(args.model) as url:
            use(url, args.api_key)


if __name__ == "__main__":
    main()

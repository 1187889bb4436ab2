"""An agent written with the official `anthropic` package, against the policy's Messages API:
`python docs/examples/anthropic_client.py`.

With `--base-url` it talks to a server that is already up; without, it starts `agentgym-rl serve --model tiny-random`
on a free port of 127.0.0.1 for the length of the script. It asks for a seeded message twice (the same reply),
streams it through the SDK's stream helper (the same message again), then plays three turns of one recorded
episode, its token in `metadata.user_id`, posts the episode's reward and reads back that the episode will train.
"""

from __future__ import annotations

import argparse

import httpx
from anthropic import Anthropic
from serve_client import local_server  # the same folder: starts `agentgym-rl serve` for the script's length

SYSTEM = "You are an agent in a grid world. Answer with one action."
OBSERVATIONS = ["You see a red ball 2 steps ahead.", "You moved forward.", "The ball is in front of you."]


def text_of(message) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


def use(base_url: str, api_key: str, model: str) -> None:
    client = Anthropic(base_url=base_url, api_key=api_key)
    ask = {
        "model": model,
        "max_tokens": 12,
        "system": SYSTEM,
        "messages": [{"role": "user", "content": OBSERVATIONS[0]}],
        "extra_body": {"seed": 7},  # not an Anthropic field: newer SDKs send it (and temperature) as extra_body
    }
    replies = [client.messages.create(**ask) for _ in range(2)]
    print(f"reply (seed 7, twice): {text_of(replies[0])!r}, stop_reason {replies[0].stop_reason}")
    assert text_of(replies[0]) == text_of(replies[1]), "the same seed must give the same message"
    with client.messages.stream(**ask) as stream:
        streamed = stream.get_final_message()
    assert text_of(streamed) == text_of(replies[0]), "a streamed message with the same seed is the same text"

    # One episode: opened on the endpoint, each call tagged with its token, closed with a reward.
    headers = {"x-api-key": api_key}
    opened = httpx.post(f"{base_url}/v1/episodes", json={"env": "babyai", "task_id": 3}, headers=headers, timeout=60)
    episode = opened.json()
    messages: list[dict] = []
    for observation in OBSERVATIONS:
        messages.append({"role": "user", "content": observation})
        reply = client.messages.create(
            model=model,
            max_tokens=12,
            system=SYSTEM,
            messages=messages,
            metadata={"user_id": f"episode:{episode['token']}"},
        )
        # The reply goes back as it came: its content blocks (an empty reply as empty text).
        messages.append(
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content] or ""}
        )
    closed = httpx.post(
        f"{base_url}/v1/episodes/{episode['id']}/reward",
        json={"reward": 1.0},
        headers={**headers, "X-Episode-Token": episode["token"]},
        timeout=60,
    ).json()
    print(
        f"episode {closed['id']}: {closed['turns']} turns, {closed['sampled_tokens']} sampled tokens, trainable: {closed['trainable']}"
    )
    assert closed["turns"] == 3 and closed["trainable"], closed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", help="a running server, e.g. http://127.0.0.1:8000 (default: start one)")
    parser.add_argument("--api-key", default="none", help="the server's --api-key, if it has one")
    parser.add_argument(
        "--model", default="tiny-random", help="the served model id (and the model of a server started here)"
    )
    args = parser.parse_args(argv)
    if args.base_url:
        use(args.base_url, args.api_key, args.model)
    else:
        with local_server(args.model) as url:
            use(url, args.api_key, args.model)


if __name__ == "__main__":
    main()

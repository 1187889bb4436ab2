"""An agent written with the official `openai` package's Responses API, against the policy endpoint:
`python docs/examples/responses_client.py`.

With `--base-url` it talks to a server that is already up; without, it starts `agentgym-rl serve --model tiny-random`
on a free port of 127.0.0.1 for the length of the script. It asks for a seeded response twice (the same reply),
streams it (the same text again, and the same response in the last event), then plays three turns of one recorded
episode, its token in `user`, the whole conversation sent each turn (the endpoint stores nothing), posts the
episode's reward and reads back that the episode will train.
"""

from __future__ import annotations

import argparse

import httpx
from openai import OpenAI
from serve_client import local_server  # the same folder: starts `agentgym-rl serve` for the script's length

INSTRUCTIONS = "You are an agent in a grid world. Answer with one action."
OBSERVATIONS = ["You see a red ball 2 steps ahead.", "You moved forward.", "The ball is in front of you."]


def use(base_url: str, api_key: str, model: str) -> None:
    client = OpenAI(base_url=f"{base_url}/v1", api_key=api_key)
    ask = {
        "model": model,
        "instructions": INSTRUCTIONS,
        "input": OBSERVATIONS[0],
        "max_output_tokens": 12,
        "extra_body": {"seed": 7},  # not an OpenAI field: this server's own, sent with extra_body
    }
    replies = [client.responses.create(**ask) for _ in range(2)]
    print(f"reply (seed 7, twice): {replies[0].output_text!r}, status {replies[0].status}")
    assert replies[0].output_text == replies[1].output_text, "the same seed must give the same response"

    # The stream ends with `response.completed`, or `response.incomplete` when max_output_tokens cut the reply
    # (the SDK's `responses.stream(...)` helper returns a final response for the first only).
    events = list(client.responses.create(**ask, stream=True))
    streamed = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert streamed == events[-1].response.output_text == replies[0].output_text, "a streamed reply is the same text"

    # One episode: opened on the endpoint, each call tagged with its token, closed with a reward.
    headers = {"Authorization": f"Bearer {api_key}"}
    opened = httpx.post(f"{base_url}/v1/episodes", json={"env": "babyai", "task_id": 3}, headers=headers, timeout=60)
    episode = opened.json()
    conversation: list = []
    for observation in OBSERVATIONS:
        conversation.append({"role": "user", "content": observation})
        reply = client.responses.create(
            model=model,
            instructions=INSTRUCTIONS,
            input=conversation,
            max_output_tokens=12,
            user=f"episode:{episode['token']}",
        )
        conversation += reply.output  # the reply goes back as it came: its output items
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

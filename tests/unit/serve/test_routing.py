"""The episode-affinity router's key: the episode id of a request's X-Episode-Token header, read from the request
as Ray Serve's HTTP proxy forwards it (integration: tests/integration/test_serve_affinity.py)."""

from __future__ import annotations

import asyncio
import pickle

from ray.serve._private.common import RequestMetadata, StreamingHTTPRequest
from ray.serve.request_router import PendingRequest

from agentgym_rl.serve.routing import episode_key


def forwarded(headers: list[tuple[bytes, bytes]]) -> PendingRequest:
    """A request as the proxy hands it to the router: its ASGI scope pickled, as the proxy sends it."""
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": headers}
    request = StreamingHTTPRequest(asgi_scope=scope, proxy_actor_name="proxy")
    metadata = RequestMetadata(request_id="r", internal_request_id="i")
    return pending([pickle.dumps(request)], metadata)


def pending(args: list, metadata: RequestMetadata) -> PendingRequest:
    # Its future needs a loop; the router only reads the request's arguments.
    return PendingRequest(args=args, kwargs={}, metadata=metadata, future=asyncio.new_event_loop().create_future())


def test_the_key_is_the_episode_id_never_its_secret():
    assert episode_key(forwarded([(b"x-episode-token", b"ep-12ab.s3cret")])) == "ep-12ab"
    assert episode_key(forwarded([(b"X-Episode-Token", b" ep-9.x ")])) == "ep-9"


def test_a_request_outside_an_episode_or_not_from_the_proxy_has_no_key():
    assert episode_key(forwarded([(b"authorization", b"Bearer k")])) is None
    assert episode_key(forwarded([(b"x-episode-token", b"")])) is None
    handle_call = pending([{"prompt_ids": [1]}], RequestMetadata("r", "i"))
    assert episode_key(handle_call) is None
    assert episode_key(None) is None

"""Keeping an episode on one replica: Ray Serve's proxy asks a request router which replica takes each HTTP request,
and :class:`EpisodeAffinityRouter` sends every call of an episode to the replica that took its first one, where its
prefix is cached (``serve.prefix_cache_tokens``). ``serve.episode_affinity`` turns it on (the default).

The router sees the request as the proxy forwards it (its ASGI scope: path and headers, not the body), so an
episode is recognised by its ``X-Episode-Token`` header; calls that carry their token only in the body (``user``,
``metadata.user_id``) are routed as calls outside any episode.
"""

from __future__ import annotations

import pickle
import random
from collections import Counter, OrderedDict
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica
from typing_extensions import override

EPISODE_HEADER = b"x-episode-token"
DEFAULT_MAX_EPISODES = 100_000


def episode_key(request: PendingRequest | None) -> str | None:
    """The episode id a request's ``X-Episode-Token`` header names (never its secret); None for a request without
    one, or one that did not come through the HTTP proxy."""
    if request is None or not request.args or not isinstance(request.args[0], bytes):
        return None
    try:
        forwarded = pickle.loads(request.args[0])  # the proxy's own pickle of the request's ASGI scope
    except Exception:  # noqa: BLE001 -- not the proxy's request: no episode to route by
        return None
    scope = getattr(forwarded, "asgi_scope", None)
    if not isinstance(scope, dict):
        return None
    for name, value in scope.get("headers", ()):
        if name.lower() == EPISODE_HEADER:
            episode_id = value.decode("latin-1").strip().partition(".")[0]
            return episode_id or None
    return None


class EpisodeAffinityRouter(RequestRouter):
    """Routes each call of an episode to the replica that served its first call, falling back to another only if
    that one is gone. A first call (and any request outside an episode) goes to the running replica holding the
    fewest episodes, ties broken at random.

    Kwargs (``RequestRouterConfig.request_router_kwargs``): ``max_episodes``, the most episodes it remembers
    (the least recently routed are forgotten first).
    """

    @override
    def initialize_state(self, **kwargs: Any) -> None:
        self.max_episodes = int(kwargs.get("max_episodes", DEFAULT_MAX_EPISODES))
        self.assigned: OrderedDict[str, ReplicaID] = OrderedDict()
        self.held: Counter[ReplicaID] = Counter()  # episodes assigned to each replica

    @override
    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        key = episode_key(pending_request)
        home = self.assigned.get(key) if key is not None else None
        for replica in candidate_replicas:
            if replica.replica_id == home:
                return [[replica]]
        fewest = min(self.held[replica.replica_id] for replica in candidate_replicas)
        least = [replica for replica in candidate_replicas if self.held[replica.replica_id] == fewest]
        return [[random.choice(least)]]

    @override
    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        key = episode_key(pending_request)
        if key is None:
            return
        previous = self.assigned.pop(key, None)
        if previous is not None:
            self.held[previous] -= 1
        self.assigned[key] = replica_id
        self.held[replica_id] += 1
        while len(self.assigned) > self.max_episodes:
            _, forgotten = self.assigned.popitem(last=False)
            self.held[forgotten] -= 1

    @override
    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        for key in [key for key, replica in self.assigned.items() if replica == replica_id]:
            del self.assigned[key]
        self.held.pop(replica_id, None)

"""Weight transports: the ways a version crosses from learner rank 0 into the samplers' engines, registered by
name (``register_transport``), each a class with one method, ``deliver``.

``SamplerGroup.sync_weights`` picks the transport (``trainer.weight_sync.method``, and for a broadcast the devices
both ends really hold: ``actors.transport.choose_transport``), keeps it while the samplers stay the same, and
sends the version through the object store instead when a delivery fails. The process group a broadcast needs
(joining, sending, receiving) is ``actors.weight_sync``'s; CUDA IPC's tensor sharing is ``actors.transport``'s.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Protocol

import ray
import structlog

from agentgym_rl.actors.transport import DeviceIdentity, SharedWeights
from agentgym_rl.actors.weight_sync import GroupAddress
from agentgym_rl.configs.schema import WeightSyncConfig

log = structlog.get_logger()


class WeightSource(Protocol):
    """Where each version comes from: the learners (``driver.learner_group.LearnerGroup``), rank 0 sending.

    Every method that starts a call on the learners returns its refs without waiting, so the samplers' side of
    a transfer can start meanwhile.
    """

    device: str  # where the learners compute: ``cpu`` or ``cuda``

    def published(self) -> list[ray.ObjectRef]:
        """The current version in the object store (``[ref]``), put there on the first call for this version."""

    def published_bytes(self) -> int:
        """The size of the version last put in the object store."""

    def device_identity(self) -> DeviceIdentity:
        """Where rank 0 holds the tensors it sends."""

    def weight_group_address(self) -> tuple[str, int]:
        """Where rank 0 hosts a weight group (its node's address, a free port)."""

    def join_weight_group(self, address: GroupAddress) -> ray.ObjectRef:
        """Start rank 0's join of the weight group at ``address`` (it returns once every member joined)."""

    def broadcast_weights(self, bucket_bytes: int) -> list[ray.ObjectRef]:
        """Start every learner's part of a broadcast of the current version; rank 0's result is the bytes sent."""

    def share_weights(self) -> SharedWeights:
        """Share the current version's tensors by CUDA IPC (rank 0 keeps them until ``release_shared_weights``)."""

    def release_shared_weights(self) -> None:
        """Let go of the tensors ``share_weights`` shared."""


@dataclass
class Delivered:
    """What one delivery did: the versions the samplers loaded, why each of the others did not, and the bytes
    that crossed (0 where the object store's copy went: ``WeightSource.published_bytes`` tells its size)."""

    versions: list[int]
    failures: list[str]
    sent_bytes: int


# Awaits one load call per sampler, each up to a timeout (None: no limit); a lost sampler leaves its pool.
# Returns the versions loaded and what failed: ``SamplerGroup._await_loads``.
AwaitLoads = Callable[[dict[ray.ObjectRef, ray.actor.ActorHandle], float | None], tuple[list[int], list[str]]]


class WeightTransport(ABC):
    """One way to deliver a version to a fixed set of samplers.

    Args:
        source: the learners.
        samplers: the receivers; a transport built for them is kept while they stay the same.
        config: ``trainer.weight_sync``.
        adapter: whether versions hold a LoRA adapter alone (``learner.lora.enabled``).
        backend: the collective's backend where the transport has one (``nccl`` or ``gloo``).

    Raises:
        ray.exceptions.RayTaskError: a group the transport needs did not form.
    """

    name: ClassVar[str]

    def __init__(
        self,
        source: WeightSource,
        samplers: list[ray.actor.ActorHandle],
        config: WeightSyncConfig,
        *,
        adapter: bool,
        backend: str | None = None,
    ) -> None:
        self.source = source
        self.samplers = samplers
        self.config = config
        self.adapter = adapter
        self.backend = backend

    @abstractmethod
    def deliver(self, await_loads: AwaitLoads) -> Delivered:
        """Send the learners' current version to ``samplers``, waiting with ``await_loads``."""


TRANSPORTS: dict[str, type[WeightTransport]] = {}


def register_transport(name: str) -> Callable[[type[WeightTransport]], type[WeightTransport]]:
    """Class decorator: register a ``WeightTransport`` as ``name``."""

    def register(cls: type[WeightTransport]) -> type[WeightTransport]:
        cls.name = name
        TRANSPORTS[name] = cls
        return cls

    return register


def transport_class(name: str) -> type[WeightTransport]:
    """The transport registered as ``name``.

    Raises:
        KeyError: no transport has that name; the message lists those that do.
    """
    if name not in TRANSPORTS:
        raise KeyError(f"unknown weight transport {name!r}; registered: {', '.join(sorted(TRANSPORTS))}")
    return TRANSPORTS[name]


@register_transport("object_store")
class ObjectStore(WeightTransport):
    """The version goes into Ray's object store once (the learners publish it) and every sampler reads it."""

    def deliver(self, await_loads: AwaitLoads) -> Delivered:
        payload = self.source.published()
        versions, failures = await_loads({s.load_weights.remote(payload): s for s in self.samplers}, None)
        return Delivered(versions, failures, 0)


@register_transport("broadcast")
class Broadcast(WeightTransport):
    """Learner rank 0 broadcasts the version in buckets to a weight group that every sampler's engine joined
    (one rank or more each), over NCCL or gloo; formed once, when the transport is built."""

    def __init__(
        self,
        source: WeightSource,
        samplers: list[ray.actor.ActorHandle],
        config: WeightSyncConfig,
        *,
        adapter: bool,
        backend: str | None = None,
    ) -> None:
        super().__init__(source, samplers, config, adapter=adapter, backend=backend)
        identities = ray.get([sampler.weight_group_identities.remote(adapter) for sampler in samplers])
        host, port = source.weight_group_address()
        ranks = [len(own) for own in identities]
        address = GroupAddress(host, port, 1 + sum(ranks), backend, config.timeout_s)
        firsts = [1 + sum(ranks[:i]) for i in range(len(samplers))]
        joins = [source.join_weight_group(address)]
        joins += [sampler.join_weight_group.remote(address, first, adapter) for sampler, first in zip(samplers, firsts)]
        ray.get(joins)
        log.info("weight group formed", members=address.world_size, backend=backend, address=f"{host}:{port}")

    def deliver(self, await_loads: AwaitLoads) -> Delivered:
        sends = self.source.broadcast_weights(int(self.config.bucket_mb * 2**20))
        # A broadcast's receivers time out by themselves (the group's timeout).
        versions, failures = await_loads({s.receive_weights.remote(): s for s in self.samplers}, None)
        return Delivered(versions, failures, ray.get(sends)[0])


@register_transport("cuda_ipc")
class CudaIpc(WeightTransport):
    """Every sampler's engine is on learner rank 0's GPU: rank 0 shares the version's tensors and each engine
    copies them in place; rank 0 lets them go once every load has returned."""

    def deliver(self, await_loads: AwaitLoads) -> Delivered:
        shared = self.source.share_weights()
        try:
            loads = {sampler.load_shared_weights.remote(shared): sampler for sampler in self.samplers}
            versions, failures = await_loads(loads, self.config.timeout_s)
        finally:
            self.source.release_shared_weights()
        return Delivered(versions, failures, shared.num_bytes)

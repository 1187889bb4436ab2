"""Weight delivery: each new version of the policy from learner rank 0 to every sampler and the serving endpoint,
by the object store, a broadcast or CUDA IPC (``trainer.weight_sync``), and the weight group a broadcast needs.

The process group itself (joining, sending, receiving) is ``actors.weight_sync``'s; this module decides who
takes part, which transport carries a version, and what happens when one fails.
"""

from __future__ import annotations

import time

import ray
import structlog

from agentgym_rl.actors.pools import SamplerPool, first_line, sampler_lost
from agentgym_rl.actors.transport import Transport, choose_transport
from agentgym_rl.actors.weight_sync import GroupAddress
from agentgym_rl.configs import Config
from agentgym_rl.driver.learner_group import LearnerGroup
from agentgym_rl.driver.rollout_dispatch import RolloutDispatch

log = structlog.get_logger()

# A sampler that loads a version, with the pool it leaves when it was lost.
Receiver = tuple[SamplerPool, ray.actor.ActorHandle]


class WeightDelivery:
    """Sends each version the learners publish to the samplers and the endpoint, and knows the one they hold.

    Args:
        config: the resolved run config.
        learners: the learner group (rank 0 publishes and sends).
        rollouts: the samplers that receive every version.
    """

    def __init__(self, config: Config, learners: LearnerGroup, rollouts: RolloutDispatch) -> None:
        self.config = config
        self.learners = learners
        self.rollouts = rollouts
        self.endpoint = None  # the Serve model deployment's handle while the run serves
        self.version = 0  # the weights version the samplers (or, without samplers, the endpoint) hold
        self.group_members: list[ray.actor.ActorHandle] | None = None  # the samplers of the weight group
        self.transport: Transport | None = None  # how versions reach group_members (``_form_group``)
        self.payload: list[ray.ObjectRef] | None = None  # this version in the object store, once published
        self.sent_bytes = 0  # the size of the last version sent

    @property
    def broadcasting(self) -> bool:
        """Whether versions go from the learner straight into the samplers' engines, by broadcast or CUDA IPC
        (``trainer.weight_sync.method``)."""
        method = self.config.trainer.weight_sync.method
        return method == "broadcast" or (method == "auto" and self.learners.device == "cuda")

    def forget_group(self) -> None:
        """The learners were replaced: the next broadcast forms a new weight group."""
        self.group_members = None

    def sync(self, iteration: int | None = None) -> float:
        """Send the learner's weights to every sampler and the serving endpoint; returns the seconds it took (0
        where nobody reads them: offline mode without ``serve.enabled``) and leaves the bytes of the version in
        ``sent_bytes``.

        Raises:
            LearnerLost | TrainError: a learner died (see ``LearnerGroup.died``).
        """
        if not self.rollouts.slots and self.endpoint is None:
            return 0.0
        receivers = self.rollouts.receivers()
        started = time.perf_counter()
        self.payload = None  # the object store's copy of this version is published when first needed
        self.rollouts.offer_weights(self.published)
        if receivers and self.broadcasting:
            self._broadcast(receivers, iteration)
        elif receivers:
            self._load_from_object_store(receivers, iteration)
        if self.endpoint is not None:
            # The server swaps between generate batches.
            served = self.endpoint.update_weights.remote(self.published(), iteration).result()
            if not receivers:  # no samplers (offline, gateway): the endpoint holds the run's version
                self.version = served
        if self.payload is not None and not (receivers and self.broadcasting):
            self.sent_bytes = ray.get(self.learners.rank0.last_published_bytes.remote())
        return time.perf_counter() - started

    def published(self) -> list[ray.ObjectRef]:
        """The current version in the object store (``[ref]``), put there by the learners on first need."""
        if self.payload is None:
            try:
                # Every learner takes part (ZeRO-3 gathers the parameters); rank 0 returns the reference.
                self.payload = ray.get([learner.publish_weights.remote() for learner in self.learners.actors])[0]
            except ray.exceptions.RayActorError as exc:
                raise self.learners.died("the weight sync", exc) from exc
        return self.payload

    def _load_from_object_store(self, receivers: list[Receiver], iteration: int | None) -> None:
        payload_ref = self.published()
        loads = {sampler.load_weights.remote(payload_ref): (pool, sampler) for pool, sampler in receivers}
        versions = []
        for ref, (pool, sampler) in loads.items():
            try:
                versions.append(ray.get(ref))
            except ray.exceptions.RayError as exc:
                if isinstance(exc, ray.exceptions.RayTaskError) and isinstance(exc, ray.exceptions.ObjectLostError):
                    # The payload died with its owner, the learner that published it.
                    raise self.learners.died("the weight sync", exc) from exc
                if not sampler_lost(exc):
                    raise
                pool.lose(sampler, iteration, exc)
        if versions:
            self.version = versions[0]

    def _broadcast(self, receivers: list[Receiver], iteration: int | None) -> None:
        """Send this version from learner rank 0 straight into the samplers' engines by the transport the devices
        of both ends call for (``actors.transport.choose_transport``; chosen again, with the weight group formed
        again, when the samplers changed): CUDA IPC where every engine is on the learner's GPU, else a broadcast.
        A failed sync (a sampler lost on the way, a timeout, a group that did not form) is said in a warning and
        this version goes through the object store instead; the learner goes on."""
        cfg = self.config.trainer.weight_sync
        members = [sampler for _, sampler in receivers]
        try:
            if self.group_members != members:
                self.group_members = self.transport = None
                self.transport = self._form_group(members)
                self.group_members = members
            if self.transport == "cuda_ipc":
                versions, failures = self._share(receivers, iteration)
            else:
                bucket = int(cfg.bucket_mb * 2**20)
                sends = [learner.broadcast_weights.remote(bucket) for learner in self.learners.actors]
                receives = {sampler.receive_weights.remote(): (pool, sampler) for pool, sampler in receivers}
                versions, failures = self._await_loads(receives, iteration)
                self.sent_bytes = ray.get(sends)[0]
        except ray.exceptions.RayActorError as exc:
            raise self.learners.died("the weight sync", exc) from exc
        except ray.exceptions.RayTaskError as exc:  # the group did not form, or the sender's broadcast failed
            failures = [first_line(exc)]
        if failures:
            self.group_members = None  # formed again at the next sync
            log.warning(
                "weight sync failed; this version goes through the object store",
                transport=self.transport,
                reasons=failures,
            )
            live = [(pool, sampler) for pool, sampler in receivers if sampler in pool.samplers]
            self._load_from_object_store(live, iteration)
            self.sent_bytes = ray.get(self.learners.rank0.last_published_bytes.remote())
            return
        self.version = versions[0]

    def _await_loads(
        self, loads: dict[ray.ObjectRef, Receiver], iteration: int | None, timeout_s: float | None = None
    ) -> tuple[list[int], list[str]]:
        """Wait for the samplers' loads of one version, each up to ``timeout_s`` (a lost sampler leaves its pool);
        returns the versions loaded and what failed."""
        versions, failures = [], []
        for ref, (pool, sampler) in loads.items():
            try:
                versions.append(ray.get(ref, timeout=timeout_s))
            except ray.exceptions.RayError as exc:
                failures.append(first_line(exc))
                if sampler_lost(exc):
                    pool.lose(sampler, iteration, exc)
        return versions, failures

    def _share(self, receivers: list[Receiver], iteration: int | None) -> tuple[list[int], list[str]]:
        """CUDA IPC: learner rank 0 shares this version's tensors on its GPU and every sampler's engine, on the same
        GPU, copies them in place; rank 0 lets them go once every load has returned. Returns the versions loaded
        and what failed."""
        sender = self.learners.rank0
        shared = ray.get([learner.share_weights.remote() for learner in self.learners.actors])[0]
        try:
            loads = {sampler.load_shared_weights.remote(shared): (pool, sampler) for pool, sampler in receivers}
            # A broadcast's receivers time out by themselves (the group's timeout); these wait here.
            versions, failures = self._await_loads(loads, iteration, self.config.trainer.weight_sync.timeout_s)
        finally:
            ray.get(sender.release_shared_weights.remote())
        self.sent_bytes = shared.num_bytes
        return versions, failures

    def _form_group(self, members: list[ray.actor.ActorHandle]) -> Transport:
        """Choose the transport from where learner rank 0 and ``members``' engines hold their tensors, and for a
        broadcast form its weight group (each engine takes one rank or more); returns the transport."""
        cfg = self.config.trainer.weight_sync
        adapter = self.config.learner.lora.enabled
        sender = self.learners.rank0
        identity = ray.get(sender.device_identity.remote())
        identities = ray.get([sampler.weight_group_identities.remote(adapter) for sampler in members])
        transport = choose_transport(identity, [own_identity for own in identities for own_identity in own])
        if transport == "cuda_ipc":
            log.info("weights go by CUDA IPC", receivers=len(members), gpu=identity.device)
            return transport
        host, port = ray.get(sender.weight_group_address.remote())
        ranks = [len(own) for own in identities]
        address = GroupAddress(host, port, 1 + sum(ranks), transport, cfg.timeout_s)
        firsts = [1 + sum(ranks[:i]) for i in range(len(members))]
        joins = [sender.join_weight_group.remote(address)]
        joins += [sampler.join_weight_group.remote(address, first, adapter) for sampler, first in zip(members, firsts)]
        ray.get(joins)
        log.info("weight group formed", members=address.world_size, backend=transport, address=f"{host}:{port}")
        return transport

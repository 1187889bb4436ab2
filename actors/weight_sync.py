"""Policy weights from learner rank 0 to the engines by collective broadcast (``trainer.weight_sync``).

Learner rank 0 and every process that receives weights (a transformers engine's sampler, each of a vLLM
engine's workers) form a process group of their own, apart from the learners' training group: NCCL when
the weights live on GPUs, gloo otherwise. Rank 0 hosts the group's store at an address on its node.

One version is a header and then the tensors. The header (JSON: version, adapter scale, each tensor's
name, dtype and shape) is broadcast as its length and its bytes, so receivers need nothing from anyone
else. The tensors follow in buckets: consecutive tensors are packed into one byte buffer until it holds
``bucket_bytes`` (a larger tensor is a bucket of its own), and each buffer is one broadcast. The sender
casts each bucket's tensors to the samplers' dtype as it packs that bucket, so no cast copy of the whole
model exists at once; receivers view each tensor in the bucket that brought it (copying only one whose
offset does not suit its dtype) and can load a bucket before the next arrives.

Which backend a group uses is chosen from the devices its ends hold (``actors.transport.choose_transport``):
NCCL only when every member is on a GPU of its own. A failed or timed-out collective raises
:class:`WeightGroupError` in every member it reaches and never ends the process: for NCCL the group is
formed with blocking waits (``wait()`` raises once ``timeout_s`` passes) and asynchronous error handling
that aborts the communicator without tearing the process down (see ``NCCL_ERRORS_RAISE``).

The object store (``actors.weights``) stays the path for everything outside the group: serving
replicas, samplers that join between syncs, runs whose learners and samplers are in different clusters.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

import torch
import torch.distributed as dist

from agentgym_rl.configs.errors import AgentGymError


class WeightGroupError(AgentGymError, RuntimeError):
    """A weight group could not form or a broadcast failed (a member missing, a timeout)."""


# Set before a weight group's NCCL process group forms (ProcessGroupNCCL reads them when it is constructed).
# TORCH_NCCL_BLOCKING_WAIT=1: ``wait()`` blocks and raises once the collective's timeout passes, instead of
# returning at once and leaving the timeout to NCCL's watchdog. TORCH_NCCL_ASYNC_ERROR_HANDLING=2: on an error
# the watchdog only aborts the communicator (1 also tears the process down; 3, torch's default, tears it down
# without the abort). So a failed broadcast is an exception the learner catches, not the learner's end.
NCCL_ERRORS_RAISE = {"TORCH_NCCL_BLOCKING_WAIT": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"}


@dataclass(frozen=True)
class GroupAddress:
    """Where a weight group meets and who is in it: rank 0 hosts the store at ``host:port``."""

    host: str
    port: int
    world_size: int
    backend: Literal["gloo", "nccl"]
    timeout_s: float


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def num_bytes(self) -> int:
        numel = 1
        for size in self.shape:
            numel *= size
        return numel * torch.empty((), dtype=getattr(torch, self.dtype)).element_size()


@dataclass(frozen=True)
class Header:
    """What receivers learn before the tensors: their version, adapter scale (None: full weights) and layout."""

    version: int
    lora_scale: float | None
    tensors: tuple[TensorSpec, ...]
    bucket_bytes: int

    def to_bytes(self) -> bytes:
        specs = [[t.name, t.dtype, list(t.shape)] for t in self.tensors]
        record = {"version": self.version, "lora_scale": self.lora_scale, "tensors": specs, "bucket": self.bucket_bytes}
        return json.dumps(record).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Header:
        record = json.loads(data)
        specs = tuple(TensorSpec(name, dtype, tuple(shape)) for name, dtype, shape in record["tensors"])
        return cls(record["version"], record["lora_scale"], specs, record["bucket"])

    def buckets(self) -> list[list[TensorSpec]]:
        """The tensors in broadcast order, grouped as the sender packs them (both sides compute the same)."""
        buckets: list[list[TensorSpec]] = []
        size = self.bucket_bytes
        for spec in self.tensors:
            if size >= self.bucket_bytes:
                buckets.append([])
                size = 0
            buckets[-1].append(spec)
            size += spec.num_bytes
        return buckets

    @property
    def num_bytes(self) -> int:
        return sum(t.num_bytes for t in self.tensors)


def group_device(backend: Literal["gloo", "nccl"], device: torch.device | str) -> torch.device:
    """Where a member of a ``backend`` weight group holds its buffers: its CUDA ``device`` under NCCL (which
    cannot broadcast host memory), the CPU under gloo.

    Raises:
        WeightGroupError: NCCL with a ``device`` that is not a GPU.
    """
    device = torch.device(device)
    if backend == "gloo":
        return torch.device("cpu")
    if device.type != "cuda":
        raise WeightGroupError(
            f"an NCCL weight group needs its members' tensors on a GPU, and this member's are on {device}; "
            "choose_transport picks gloo for a member on the CPU"
        )
    return device


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` now."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def free_address() -> tuple[str, int]:
    """This node's address (as Ray knows it, else loopback) and a TCP port free on it now: where a process
    group hosted here meets (a weight group, a learner group)."""
    try:
        import ray

        host = ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"
    except ImportError:
        host = "127.0.0.1"
    return host, free_port(host)


class WeightGroup:
    """One member's end of a weight group; rank 0 sends, the others receive.

    Joining blocks until every member has joined (or ``timeout_s`` passes). ``device`` is where this
    member's tensors live; its buffers are on ``group_device(backend, device)``.

    Raises:
        WeightGroupError: the group did not form within its timeout, or NCCL with ``device`` off the GPU.
    """

    def __init__(self, address: GroupAddress, rank: int, device: torch.device | str = "cpu") -> None:
        self.address = address
        self.rank = rank
        self.device = group_device(address.backend, device)
        timeout = timedelta(seconds=address.timeout_s)
        try:
            self.store = dist.TCPStore(
                address.host, address.port, address.world_size, rank == 0, timeout=timeout, wait_for_workers=False
            )
            if address.backend == "nccl":
                os.environ.update(NCCL_ERRORS_RAISE)
                options = dist.ProcessGroupNCCL.Options()
                options._timeout = timeout
                self.group = dist.ProcessGroupNCCL(self.store, rank, address.world_size, options)
            else:
                self.group = dist.ProcessGroupGloo(self.store, rank, address.world_size, timeout)
        except (RuntimeError, dist.DistStoreError) as exc:
            raise WeightGroupError(
                f"weight group at {address.host}:{address.port} ({address.world_size} members, rank {rank}) did not "
                f"form within {address.timeout_s:g} s: {exc}"
            ) from exc

    def _broadcast(self, tensor: torch.Tensor) -> None:
        options = dist.BroadcastOptions()
        options.rootRank = 0
        options.timeout = timedelta(seconds=self.address.timeout_s)
        try:
            self.group.broadcast([tensor], options).wait()
        except RuntimeError as exc:
            raise WeightGroupError(f"weight broadcast failed at rank {self.rank}: {exc}") from exc

    def send(
        self,
        tensors: dict[str, torch.Tensor],
        version: int,
        lora_scale: float | None,
        bucket_bytes: int,
        dtype: torch.dtype | None = None,
    ) -> Header:
        """Broadcast ``tensors`` (rank 0 only), floating ones cast to ``dtype`` (None: as they are) a bucket
        at a time; returns the header sent."""

        def sent_dtype(tensor: torch.Tensor) -> torch.dtype:
            return dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype

        specs = tuple(
            TensorSpec(name, str(sent_dtype(t)).removeprefix("torch."), tuple(t.shape)) for name, t in tensors.items()
        )
        header = Header(version, lora_scale, specs, bucket_bytes)
        data = header.to_bytes()
        self._broadcast(torch.tensor([len(data)], dtype=torch.int64, device=self.device))
        self._broadcast(torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self.device))
        for bucket in header.buckets():
            parts = []
            for spec in bucket:
                tensor = tensors[spec.name].detach()
                parts.append(tensor.to(self.device, sent_dtype(tensor)).contiguous().reshape(-1).view(torch.uint8))
            self._broadcast(torch.cat(parts))
        return header

    def receive_header(self) -> Header:
        length = torch.zeros(1, dtype=torch.int64, device=self.device)
        self._broadcast(length)
        data = torch.empty(int(length), dtype=torch.uint8, device=self.device)
        self._broadcast(data)
        return Header.from_bytes(data.cpu().numpy().tobytes())

    def receive_buckets(self, header: Header) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """The header's tensors, one bucket at a time, as they arrive: views of the bucket's buffer (which
        lives while any of them does), or a copy for a tensor whose offset in it is not a multiple of its
        element size."""
        for bucket in header.buckets():
            buffer = torch.empty(sum(spec.num_bytes for spec in bucket), dtype=torch.uint8, device=self.device)
            self._broadcast(buffer)
            named, offset = [], 0
            for spec in bucket:
                dtype = getattr(torch, spec.dtype)
                piece = buffer[offset : offset + spec.num_bytes]
                if offset % dtype.itemsize:
                    piece = piece.clone()  # a fresh storage starts aligned
                named.append((spec.name, piece.view(dtype).reshape(spec.shape)))
                offset += spec.num_bytes
            yield named

    def receive(self) -> tuple[Header, dict[str, torch.Tensor]]:
        """The next version's header and all its tensors."""
        header = self.receive_header()
        return header, {name: tensor for bucket in self.receive_buckets(header) for name, tensor in bucket}

"""How a version of the weights crosses from the learner to the engines: chosen from the devices the two ends
really hold, and the CUDA IPC transport for ends that share one GPU.

Each end of a sync reports a :class:`DeviceIdentity` (its node and its GPU's UUID, or the CPU), and
:func:`choose_transport` picks from them, never from the config:

* ``cuda_ipc``: every receiver is on the sender's very GPU, seen from the same machine (colocated mode). The sender shares its tensors
  as CUDA IPC handles (:func:`share_cuda_tensors`, a few hundred bytes a tensor), the receivers open them
  in place (:func:`open_cuda_tensors`) and copy from them on the device; nothing touches the host.
* ``nccl``: every end on a GPU of its own. NCCL refuses two ranks on one device ("Duplicate GPU detected"),
  so two ends on one GPU (a fractional-GPU sampler beside another, or beside the learner while a third end
  is elsewhere) never get it.
* ``gloo``: anything else: an end on the CPU, or two ends sharing a GPU that is not everyone's. The
  buckets cross through host memory over TCP.

This module needs torch alone (no Ray), so the GPU check runs it on a bare GPU machine.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch.multiprocessing.reductions import reduce_tensor

Transport = Literal["cuda_ipc", "nccl", "gloo"]
CPU = "cpu"
# The position of ``storage_device`` (the sender's device index) in the arguments of torch's
# ``rebuild_cuda_tensor``; the receiver puts its own index of that GPU there.
STORAGE_DEVICE_ARG = 6


@dataclass(frozen=True)
class DeviceIdentity:
    """Where one end of a weight sync holds its tensors.

    Attributes:
        node: the hostname of the end's machine.
        device: ``"cpu"``, or the UUID of the end's GPU (``torch.cuda.get_device_properties(i).uuid``).
    """

    node: str
    device: str

    @property
    def on_gpu(self) -> bool:
        return self.device != CPU


def this_node() -> str:
    """This process's node: its hostname, which every process on the machine reports alike (Ray's node id is
    unknown to a vLLM worker that vLLM itself started, and to a process without Ray)."""
    return socket.gethostname()


def gpu_uuid(index: int) -> str:
    """The UUID of visible CUDA device ``index`` (the same in every process, whatever its visible devices)."""
    return str(torch.cuda.get_device_properties(index).uuid)


def device_identity(device: torch.device | str) -> DeviceIdentity:
    """The identity of an end holding its tensors on ``device`` (``cuda`` alone: the current CUDA device)."""
    device = torch.device(device)
    if device.type != "cuda":
        return DeviceIdentity(this_node(), CPU)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return DeviceIdentity(this_node(), gpu_uuid(index))


def choose_transport(sender: DeviceIdentity, receivers: list[DeviceIdentity]) -> Transport:
    """The transport for one sync from ``sender`` to ``receivers`` (see the module docstring).

    Raises:
        ValueError: no receivers.
    """
    if not receivers:
        raise ValueError("choose_transport needs at least one receiver")
    ends = [sender, *receivers]
    if not all(end.on_gpu for end in ends):
        return "gloo"
    if all(end == sender for end in receivers):
        return "cuda_ipc"
    # A GPU's UUID names one device wherever it is seen from: two ends with one UUID are one device to NCCL.
    gpus = [end.device for end in ends]
    if len(set(gpus)) == len(gpus):
        return "nccl"
    return "gloo"


@dataclass(frozen=True)
class CudaIpcHandles:
    """Tensors of one GPU shared with other processes on it: picklable, a few hundred bytes a tensor.

    Attributes:
        device: the UUID of the GPU that holds the tensors.
        tensors: per tensor, its name and how torch rebuilds it in another process (``reduce_tensor``).
    """

    device: str
    tensors: tuple[tuple[str, Callable[..., torch.Tensor], tuple[Any, ...]], ...]


@dataclass(frozen=True)
class SharedWeights:
    """One version of the weights shared by CUDA IPC: what a receiver on the sender's GPU loads.

    Attributes:
        handles: the tensors (Hugging Face names, or peft's for an adapter).
        version: the weights version.
        lora_scale: None for full weights; else the tensors are a LoRA adapter with this alpha / r.
        num_bytes: the tensors' size.
    """

    handles: CudaIpcHandles
    version: int
    lora_scale: float | None
    num_bytes: int


def share_cuda_tensors(tensors: dict[str, torch.Tensor]) -> CudaIpcHandles:
    """Share ``tensors`` (all on one CUDA device) with other processes on that GPU.

    The sender must keep ``tensors`` alive (and unchanged) until every receiver has loaded them: a handle
    names memory, not a copy of it.

    Raises:
        ValueError: a tensor is not on CUDA, or the tensors are on more than one device.
    """
    devices = {t.device for t in tensors.values()}
    if len(devices) != 1 or next(iter(devices)).type != "cuda":
        raise ValueError(
            f"share_cuda_tensors needs tensors on one CUDA device; they are on {sorted(map(str, devices))}"
        )
    shared = tuple((name, *reduce_tensor(tensor.detach())) for name, tensor in tensors.items())
    return CudaIpcHandles(device=gpu_uuid(next(iter(devices)).index), tensors=shared)


def open_cuda_tensors(handles: CudaIpcHandles) -> dict[str, torch.Tensor]:
    """The tensors behind ``handles``, opened in place on this process's view of the same GPU (no copy).

    They stay valid while the sender keeps its tensors; copy what must outlive that.

    Raises:
        ValueError: this process sees no GPU with the handles' UUID (it runs on another GPU or node).
    """
    index = local_index(handles.device)
    opened = {}
    for name, rebuild, args in handles.tensors:
        args = list(args)
        args[STORAGE_DEVICE_ARG] = index  # the sender's index of the GPU may differ from this process's
        opened[name] = rebuild(*args)
    return opened


def local_index(uuid: str) -> int:
    """This process's index of the GPU with ``uuid``.

    Raises:
        ValueError: no visible GPU has that UUID.
    """
    count = torch.cuda.device_count()
    for index in range(count):
        if gpu_uuid(index) == uuid:
            return index
    raise ValueError(
        f"no GPU visible to this process has UUID {uuid} ({count} visible): CUDA IPC needs sender and receiver "
        "on the same GPU; choose_transport picks another transport for ends on different GPUs"
    )

"""The transport chooser (from the devices the ends hold, never NCCL for two ranks on one GPU) and the CUDA IPC
handles (refused off CUDA here; opened in a second process on a GPU)."""

from __future__ import annotations

import inspect
import multiprocessing
import subprocess
import sys

import pytest
import torch
from torch.multiprocessing.reductions import rebuild_cuda_tensor

from agentgym_rl.actors.transport import (
    CPU,
    STORAGE_DEVICE_ARG,
    CudaIpcHandles,
    DeviceIdentity,
    choose_transport,
    device_identity,
    local_index,
    open_cuda_tensors,
    share_cuda_tensors,
    this_node,
)

GPU_A, GPU_B, GPU_C = "GPU-aaaa", "GPU-bbbb", "GPU-cccc"


def end(device: str, node: str = "node-1") -> DeviceIdentity:
    return DeviceIdentity(node, device)


@pytest.mark.parametrize(
    ("sender", "receivers", "expected"),
    [
        # colocated: the learner and its sampler hold one GPU
        (end(GPU_A), [end(GPU_A)], "cuda_ipc"),
        (end(GPU_A), [end(GPU_A), end(GPU_A)], "cuda_ipc"),
        # every end on a GPU of its own, on one node or several
        (end(GPU_A), [end(GPU_B), end(GPU_C)], "nccl"),
        (end(GPU_A), [end(GPU_B, "node-2"), end(GPU_C, "node-2")], "nccl"),
        # two fractional-GPU samplers on one GPU beside the learner's: NCCL would see a duplicate GPU
        (end(GPU_A), [end(GPU_B), end(GPU_B)], "gloo"),
        # one sampler colocated with the learner, another elsewhere
        (end(GPU_A), [end(GPU_A), end(GPU_B)], "gloo"),
        # one GPU seen from two machines' names (two containers): no IPC, and still one device to NCCL
        (end(GPU_A), [end(GPU_A, "node-2")], "gloo"),
        # anything on the CPU
        (end(CPU), [end(CPU)], "gloo"),
        (end(GPU_A), [end(CPU)], "gloo"),
        (end(CPU), [end(GPU_A), end(GPU_B)], "gloo"),
    ],
)
def test_the_transport_follows_the_devices_the_ends_hold(sender, receivers, expected):
    assert choose_transport(sender, receivers) == expected


def test_two_ends_on_one_gpu_never_get_nccl():
    gpus = [GPU_A, GPU_B]
    for sender in gpus:
        for first in gpus:
            for second in gpus:
                receivers = [end(first), end(second)]
                shared = len({sender, first, second}) < 3
                assert (choose_transport(end(sender), receivers) == "nccl") is not shared


def test_no_receivers_is_refused():
    with pytest.raises(ValueError, match="at least one receiver"):
        choose_transport(end(GPU_A), [])


def test_a_cpu_end_is_identified_by_its_node():
    identity = device_identity("cpu")
    assert identity == DeviceIdentity(this_node(), CPU)
    assert not identity.on_gpu


def test_cuda_ipc_refuses_tensors_off_cuda():
    with pytest.raises(ValueError, match="one CUDA device"):
        share_cuda_tensors({"w": torch.zeros(2)})


def test_the_receiver_rewrites_the_argument_torch_reads_as_the_storage_device():
    parameters = list(inspect.signature(rebuild_cuda_tensor).parameters)
    assert parameters[STORAGE_DEVICE_ARG] == "storage_device"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error where no GPU is visible")
def test_opening_handles_of_a_gpu_not_visible_here_says_so():
    with pytest.raises(ValueError, match="no GPU visible to this process has UUID GPU-aaaa"):
        local_index(GPU_A)


def _receive(handles: CudaIpcHandles, results: multiprocessing.Queue) -> None:
    opened = open_cuda_tensors(handles)
    results.put({name: (t.device.type, t.sum().item()) for name, t in opened.items()})
    del opened
    torch.cuda.synchronize()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_second_process_on_the_gpu_reads_the_shared_tensors_in_place():
    sent = {"w": torch.arange(6, dtype=torch.bfloat16, device="cuda").reshape(2, 3), "b": torch.ones(4, device="cuda")}
    handles = share_cuda_tensors(sent)
    assert choose_transport(device_identity("cuda"), [device_identity("cuda")]) == "cuda_ipc"
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    receiver = context.Process(target=_receive, args=(handles, results))
    receiver.start()
    received = results.get(timeout=120)
    receiver.join(timeout=60)
    assert received == {"w": ("cuda", 15.0), "b": ("cuda", 4.0)}


def test_the_transport_imports_with_torch_alone():
    # A bare GPU machine has torch but no Ray or pydantic: the GPU check imports this module there.
    code = (
        "import sys; sys.modules['ray'] = sys.modules['pydantic'] = None; "
        "from agentgym_rl.actors.transport import device_identity; print(device_identity('cpu').device)"
    )
    result = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "cpu"

"""The learner computes on ``learner.device``: policy, optimizer state and every micro-batch live there."""

from __future__ import annotations

import numpy as np
import pydantic
import pytest
import torch

from agentgym_rl.configs import Config
from agentgym_rl.learner.actor import LearnerActor, LearnerDeviceError, learner_device
from agentgym_rl.learner.algorithms import GRPO
from tests.unit.learner.helpers import batch_of

SEEN: list[set[str]] = []


class DeviceRecordingGRPO(GRPO):
    """GRPO that notes the devices of every tensor its loss receives (loaded by `module:Class` like any plug-in)."""

    def compute_loss(self, batch, forward_out):
        SEEN.append({str(t.device) for t in [*batch.values(), *forward_out.values()]})
        return super().compute_loss(batch, forward_out)


def learner_on(device: str) -> LearnerActor:
    config = Config.model_validate(
        {
            "model": {"name": "tiny-random"},
            "learner": {"device": device, "micro_batch_size": 2, "lr": 1e-3},
            "algorithm": {"name": f"{__name__}:DeviceRecordingGRPO"},
        }
    )
    return LearnerActor(model=config.model, learner=config.learner, algorithm=config.algorithm, seed=0)


def tensors_of(learner: LearnerActor) -> list[torch.Tensor]:
    params = list(learner.policy.parameters())
    state = [v for s in learner.optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    return params + state


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=[
                pytest.mark.gpu,
                pytest.mark.skipif(not torch.cuda.is_available(), reason="learner.device=cuda needs a CUDA GPU"),
            ],
        ),
    ],
)
def test_policy_optimizer_state_and_micro_batches_live_on_the_learner_device(device: str):
    SEEN.clear()
    learner = learner_on(device)
    metrics = learner.update_batch(batch_of())
    assert metrics["learner/optimizer_steps"] == 1 and metrics["learner/grad_norm"] > 0
    assert learner.describe()["device"] == str(learner_device(device))
    placed = tensors_of(learner)
    assert len(placed) > len(list(learner.policy.parameters()))  # AdamW's moments are there too
    assert {t.device.type for t in placed} == {device}
    assert SEEN and all(devices == {str(learner.device)} for devices in SEEN)
    # What leaves the learner (published weights) is on the CPU whatever it computes on.
    payload = learner.weights_payload()
    assert payload.version == 1 and all(isinstance(array, np.ndarray) for array in payload.arrays.values())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="moving the optimizer state off the GPU needs a CUDA GPU")
def test_an_offloading_learner_keeps_its_optimizer_state_in_host_memory_between_updates():
    learner = learner_on("cuda")
    learner.offload_optimizer = True  # what colocated mode sets
    for seed in range(2):  # the second update steps with the moments the first one sent to host memory
        metrics = learner.update_batch(batch_of(seed=seed))
        assert metrics["learner/optimizer_steps"] == 1 and metrics["learner/grad_norm"] > 0
    moments = [v for s in learner.optimizer.state.values() for k, v in s.items() if k != "step"]
    assert moments and {t.device.type for t in moments} == {"cpu"}
    assert {p.device.type for p in learner.policy.parameters()} == {"cuda"}
    assert [name for _, name in learner.timeline()][-3:] == [
        "optimizer state on the device",
        "update",
        "optimizer state offloaded",
    ]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_cuda_without_a_visible_gpu_is_refused_naming_the_fix():
    with pytest.raises(LearnerDeviceError, match="learner.device='cuda' but this learner sees no CUDA GPU"):
        learner_device("cuda")
    assert learner_device("auto") == torch.device("cpu")


def test_cuda_with_no_gpu_reserved_is_a_config_error():
    with pytest.raises(pydantic.ValidationError, match="learner.device='cuda' needs a GPU"):
        Config.model_validate({"learner": {"device": "cuda", "num_gpus": 0}})

"""Two DeepSpeed (ZeRO-2, gloo) learner actors on CPU match one torch learner on the same batch."""

import pytest
import ray
import torch

from agentgym_rl.actors.models import load_model
from agentgym_rl.configs import Config
from agentgym_rl.driver.learners import free_port
from agentgym_rl.learner.actor import LearnerActor
from tests.unit.learner.helpers import batch_of


def _config(backend: str, count: int) -> Config:
    return Config.model_validate(
        {
            "model": {"name": "tiny-random"},
            "algorithm": {"name": "grpo", "entropy_coef": 0.01, "kl_coef": 0.01},
            "learner": {
                "backend": backend,
                "count": count,
                "zero_stage": 2,
                "lr": 1e-3,
                "micro_batch_size": 2,
                "minibatches": 2,
                "num_cpus": 0.5,
                "num_threads": 1,
            },
        }
    )


@pytest.mark.slow
def test_two_zero2_learners_equal_one_torch_learner(ray_local):
    trajectories = batch_of(n_groups=4, group_size=3)
    refs = [ray.put(t) for t in trajectories]

    torch_cfg = _config("torch", 1)
    single = LearnerActor(model=torch_cfg.model, learner=torch_cfg.learner, algorithm=torch_cfg.algorithm, seed=0)
    expected_metrics = single.update_batch(trajectories)
    expected = single.policy.state_dict()

    ds_cfg = _config("deepspeed", 2)
    port = free_port()
    learners = [
        ray.remote(LearnerActor)
        .options(num_cpus=0.5)
        .remote(
            model=ds_cfg.model,
            learner=ds_cfg.learner,
            algorithm=ds_cfg.algorithm,
            seed=0,
            rank=rank,
            world_size=2,
            master_addr="127.0.0.1",
            master_port=port,
        )
        for rank in range(2)
    ]
    metrics = ray.get([learner.update.remote(refs) for learner in learners])
    payload = ray.get(ray.get(learners[0].publish_weights.remote())[0])
    for learner in learners:
        ray.kill(learner)

    assert metrics[0]["learner/loss"] == pytest.approx(expected_metrics["learner/loss"], rel=1e-3, abs=1e-6)
    assert metrics[0]["learner/loss"] == pytest.approx(metrics[1]["learner/loss"])
    assert metrics[0]["learner/grad_norm"] == pytest.approx(expected_metrics["learner/grad_norm"], rel=1e-3)
    initial = load_model("tiny-random").state_dict()
    moved = 0
    for name, array in payload.arrays.items():
        got = torch.from_numpy(array.copy())
        assert torch.allclose(got, expected[name], atol=2e-5), name
        moved += int(not torch.equal(got, initial[name]))
    assert moved > 0

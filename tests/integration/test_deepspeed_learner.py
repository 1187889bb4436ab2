"""Two DeepSpeed (gloo) learner actors on CPU match one torch learner on the same batch, under ZeRO-2 and ZeRO-3,
however unevenly the rows split between them."""

import pytest
import ray
import torch

from agentgym_rl.actors.model_store import load_model
from agentgym_rl.actors.weight_sync import free_port
from agentgym_rl.actors.weights import unpack_state_dict
from agentgym_rl.configs import Config
from agentgym_rl.learner.actor import LearnerActor
from tests.factories import make_trajectory
from tests.unit.learner.helpers import batch_of


def _config(
    backend: str, count: int, zero_stage: int = 2, micro_batch_size: int = 2, minibatches: int = 2, **algorithm
) -> Config:
    return Config.model_validate(
        {
            "model": {"name": "tiny-random"},
            "algorithm": {"name": "grpo", "entropy_coef": 0.01, "kl_coef": 0.01, **algorithm},
            "learner": {
                "backend": backend,
                "count": count,
                "zero_stage": zero_stage,
                "lr": 1e-3,
                "micro_batch_size": micro_batch_size,
                "minibatches": minibatches,
                "num_cpus": 0.5,
                "num_threads": 1,
                "precision": "float32",
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

    learners = _group(_config("deepspeed", 2))
    metrics = ray.get([learner.update.remote(refs) for learner in learners])
    payload = ray.get(ray.get(learners[0].publish_weights.remote())[0])
    for learner in learners:
        ray.kill(learner)

    assert metrics[0]["learner/loss"] == pytest.approx(expected_metrics["learner/loss"], rel=1e-3, abs=1e-6)
    assert metrics[0]["learner/loss"] == pytest.approx(metrics[1]["learner/loss"])
    assert metrics[0]["learner/grad_norm"] == pytest.approx(expected_metrics["learner/grad_norm"], rel=1e-3)
    initial = load_model("tiny-random").state_dict()
    moved = 0
    for name, got in unpack_state_dict(payload).items():
        assert torch.allclose(got, expected[name], atol=2e-5), name
        moved += int(not torch.equal(got, initial[name]))
    assert moved > 0


def _group(config: Config) -> list[ray.actor.ActorHandle]:
    port = free_port()
    return [
        ray.remote(LearnerActor)
        .options(num_cpus=0.5)
        .remote(
            model=config.model,
            learner=config.learner,
            algorithm=config.algorithm,
            seed=0,
            sampler_dtype="float32",  # published as the float32 master holds them
            rank=rank,
            world_size=config.learner.count,
            master_addr="127.0.0.1",
            master_port=port,
        )
        for rank in range(config.learner.count)
    ]


def _gathered_state(learner: LearnerActor) -> dict[str, torch.Tensor]:
    with learner.backend.gathered():
        return {name: value.detach().clone() for name, value in learner.policy.state_dict().items()}


@pytest.mark.slow
def test_zero3_trains_like_zero2_publishes_its_gathered_parameters_and_resumes(ray_local, tmp_path):
    refs = [ray.put(t) for t in batch_of(n_groups=4, group_size=3)]
    runs = {}
    for stage in (2, 3):
        learners = _group(_config("deepspeed", 2, zero_stage=stage))
        losses = [ray.get([lr.update.remote(refs) for lr in learners])[0]["learner/loss"] for _ in range(3)]
        published = ray.get([lr.publish_weights.remote() for lr in learners])  # every rank joins the gather
        gathered = ray.get([lr.__ray_call__.remote(_gathered_state) for lr in learners])
        runs[stage] = losses, ray.get(published[0][0]), gathered[1], published[1]
        if stage == 3:
            ray.get([lr.save_checkpoint.remote(str(tmp_path)) for lr in learners])
        for learner in learners:
            ray.kill(learner)

    # A new ZeRO-3 group restored from that checkpoint publishes the same weights.
    learners = _group(_config("deepspeed", 2, zero_stage=3))
    assert ray.get([lr.load_checkpoint.remote(str(tmp_path)) for lr in learners]) == [3, 3]
    restored = unpack_state_dict(ray.get(ray.get([lr.publish_weights.remote() for lr in learners])[0][0]))
    for learner in learners:
        ray.kill(learner)
    assert all(torch.equal(restored[name], tensor) for name, tensor in unpack_state_dict(runs[3][1]).items())

    (losses2, _, _, _), (losses3, payload3, rank1_params3, rank1_published3) = runs[2], runs[3]
    assert losses3 == pytest.approx(losses2, rel=1e-4, abs=1e-6)
    assert rank1_published3 == []  # only rank 0 hands out the reference
    # What rank 0 published is the whole parameter set another rank gathers, not its own share.
    published3 = unpack_state_dict(payload3)
    assert set(published3) == set(rank1_params3)
    for name, tensor in published3.items():
        assert torch.equal(tensor, rank1_params3[name]), name


def _uneven_batch() -> list:
    """Six rows, one micro-batch each, for two learners: whichever three each draws, one of them gets the row
    without a sampled token (its micro-batch carries no loss), so the two have 3 and 2 micro-batches to run."""
    silent = make_trajectory(list(range(10, 22)), [0] * 12, [], group=5)
    return [*batch_of(n_groups=5, group_size=1, seed=1), silent]


@pytest.mark.slow
def test_zero3_learners_given_uneven_rows_run_the_same_passes_train_like_one_learner_and_publish_by_bucket(ray_local):
    trajectories = _uneven_batch()
    every_row = {"micro_batch_size": 1, "minibatches": 1, "skip_uniform_groups": False}  # each row its own pass
    torch_cfg = _config("torch", 1, **every_row)
    single = LearnerActor(model=torch_cfg.model, learner=torch_cfg.learner, algorithm=torch_cfg.algorithm, seed=0)
    expected_metrics = single.update_batch(trajectories)
    expected = single.policy.state_dict()

    learners = _group(_config("deepspeed", 2, zero_stage=3, **every_row))
    refs = [ray.put(t) for t in trajectories]
    metrics = ray.get([learner.update.remote(refs) for learner in learners], timeout=300)
    passes = ray.get([learner.__ray_call__.remote(lambda lr: lr.backend.backward_passes) for learner in learners])
    published = ray.get([learner.publish_weights.remote() for learner in learners])  # one 256 MiB bucket
    whole_peaks = ray.get(
        [learner.__ray_call__.remote(lambda lr: lr.backend.gathered_peak_bytes) for learner in learners]
    )
    # Published again a MiB at a time: the same weights, and never more of them whole at once than a bucket (or
    # the one parameter larger than it), as DeepSpeed's own status of each parameter says.
    bucket = 2**20
    by_bucket = ray.get([learner.publish_weights.remote(bucket) for learner in learners])
    peaks = ray.get([learner.__ray_call__.remote(lambda lr: lr.backend.gathered_peak_bytes) for learner in learners])
    for learner in learners:
        ray.kill(learner)
    sizes = [p.numel() * 4 for p in load_model("tiny-random").parameters()]  # float32 on the learners
    assert whole_peaks == [sum(sizes)] * 2  # in one bucket, the whole model at once
    # tiny-random's (tied) embedding is 98 % of it and a bucket alone; the rest came a MiB at a time
    assert 0 < max(peaks) <= max(bucket, max(sizes)) < sum(sizes)
    whole, bucketed = (unpack_state_dict(ray.get(refs[0])) for refs in (published[0], by_bucket[0]))
    assert set(whole) == set(bucketed) and all(torch.equal(whole[name], bucketed[name]) for name in whole)

    # one learner had three micro-batches with loss, the other two and one without: both ran three passes
    assert passes == [3, 3]
    assert metrics[0]["learner/loss"] == pytest.approx(expected_metrics["learner/loss"], rel=1e-3, abs=1e-6)
    assert metrics[0]["learner/grad_norm"] == pytest.approx(expected_metrics["learner/grad_norm"], rel=1e-3)
    for name, got in unpack_state_dict(ray.get(published[0][0])).items():
        assert torch.allclose(got, expected[name], atol=2e-5), name

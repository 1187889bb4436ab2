"""DPO: the loss by hand, pair construction, and the learner keeping pairs together."""

import math

import pytest
import torch

from agentgym_rl.configs import Config
from agentgym_rl.configs.loader import apply_override
from agentgym_rl.learner.actor import LearnerActor
from agentgym_rl.learner.algorithms import build_algorithm, build_pairs
from agentgym_rl.learner.algorithms.base import LOGPROBS, LOSS_MASK, REF_LOGPROBS
from agentgym_rl.learner.algorithms.dpo import CHOSEN, PAIR
from agentgym_rl.learner.losses import dpo_loss
from tests.unit.learner.helpers import batch_of, two_turn_trajectory
from tests.unit.learner.test_learner import gradients


def make_learner(*overrides: str) -> LearnerActor:
    """A float32 DPO learner on tiny-random with a large step, so a few updates move it."""
    data: dict = {}
    base = ["model.name=tiny-random", "algorithm.name=dpo", "algorithm.beta=0.5", "learner.lr=1e-3"]
    for item in [*base, "learner.precision=float32", *overrides]:
        apply_override(data, item)
    config = Config.model_validate(data)
    return LearnerActor(model=config.model, learner=config.learner, algorithm=config.algorithm, seed=0)


def test_dpo_loss_matches_a_hand_computed_pair():
    # h = (-3 - -4) - (-5 - -4) = 2; beta 0.5 -> margin 1
    args = (torch.tensor([-3.0]), torch.tensor([-5.0]), torch.tensor([-4.0]), torch.tensor([-4.0]), 0.5)
    loss, margin = dpo_loss(*args)
    assert margin.item() == pytest.approx(1.0)
    assert loss.item() == pytest.approx(math.log(1 + math.exp(-1.0)), rel=1e-6)  # -log sigmoid(1) = 0.3133
    smoothed, _ = dpo_loss(*args, label_smoothing=0.1)
    expected = 0.9 * math.log(1 + math.exp(-1.0)) + 0.1 * math.log(1 + math.exp(1.0))  # 0.4133
    assert smoothed.item() == pytest.approx(expected, rel=1e-6)


def _episodes(spec: list[tuple[int, float]], seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [two_turn_trajectory(g, task, reward) for task, reward in spec]


def test_pairs_skip_ties_and_tasks_with_one_outcome():
    trajectories = _episodes(
        [
            (7, 0.0),  # task 7: rewards 0, 1, 0, 1 -> two pairs, best with worst
            (7, 1.0),
            (7, 0.0),
            (7, 1.0),
            (3, 1.0),  # task 3: one outcome -> no pair
            (3, 1.0),
            (5, 0.5),  # task 5: 0.5, 0.2, 0.5 -> (0.5 first, 0.2); the middle 0.5 is left over
            (5, 0.2),
            (5, 0.5),
            (9, 1.0),  # task 9: a single episode -> no pair
        ]
    )
    pairs = build_pairs(trajectories)
    assert pairs == [(1, 2), (3, 0), (6, 7)]
    assert build_pairs(trajectories) == pairs  # deterministic
    assert build_pairs(_episodes([(1, 0.0), (1, 0.0), (1, 0.0)])) == []


def test_pairs_group_by_task_not_by_position():
    trajectories = _episodes([(1, 1.0), (2, 1.0), (1, 0.0), (2, 0.0)])
    assert build_pairs(trajectories) == [(0, 2), (1, 3)]


def test_compute_loss_lines_up_each_pair_whatever_the_row_order():
    algorithm = build_algorithm("dpo", {"beta": 0.5, "label_smoothing": 0.1})
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.0, 1.0, 1.0]])
    logprobs = -torch.arange(1, 13, dtype=torch.float32).reshape(4, 3) / 4
    ref = torch.full((4, 3), -1.0)
    batch = {LOSS_MASK: mask, REF_LOGPROBS: ref}
    algorithm.compute_advantages(batch)
    loss, metrics = algorithm.compute_loss(batch, {LOGPROBS: logprobs})
    seq, ref_seq = (logprobs * mask).sum(-1), (ref * mask).sum(-1)
    expected, _ = dpo_loss(seq[[0, 2]], seq[[1, 3]], ref_seq[[0, 2]], ref_seq[[1, 3]], 0.5, 0.1)
    assert loss.item() == pytest.approx(expected.mean().item(), rel=1e-6)
    # the same rows shuffled (as a micro-batch may hold them) give the same loss
    perm = torch.tensor([3, 0, 2, 1])
    shuffled = {LOSS_MASK: mask[perm], REF_LOGPROBS: ref[perm], PAIR: batch[PAIR][perm], CHOSEN: batch[CHOSEN][perm]}
    again, _ = algorithm.compute_loss(shuffled, {LOGPROBS: logprobs[perm]})
    assert again.item() == pytest.approx(loss.item(), rel=1e-6)
    assert 0.0 <= metrics["learner/dpo_accuracy"] <= 1.0


def _pairs_batch():
    """Three tasks of four episodes with distinct rewards: six pairs."""
    return batch_of(n_groups=3, group_size=4, seed=3)


@pytest.mark.parametrize("packing", [False, True])
def test_micro_batches_never_split_a_pair_and_do_not_change_the_gradient(packing):
    trajectories = _pairs_batch()
    assert len(build_pairs(trajectories)) >= 4
    results = []
    for size in (1, 16):
        learner = make_learner(f"learner.micro_batch_size={size}", f"learner.packing={packing}")
        batch = learner.prepare(learner.algorithm.select_trajectories(trajectories))
        for micro in learner._micro_batches(batch, torch.arange(batch[LOSS_MASK].shape[0])):
            pairs = batch[PAIR][micro]
            assert sorted(pairs.tolist()) == sorted(2 * sorted(set(pairs.tolist())))  # both rows of each pair
        metrics = learner.accumulate_gradients(batch, torch.arange(batch[LOSS_MASK].shape[0]))
        results.append((metrics["learner/loss"], gradients(learner)))
    (loss_a, grads_a), (loss_b, grads_b) = results
    # before any step the policy equals the reference: every margin is 0 and the loss is log 2
    assert loss_a == pytest.approx(math.log(2), rel=1e-4) and loss_b == pytest.approx(loss_a, rel=1e-4)
    for name in grads_a:
        assert torch.allclose(grads_a[name], grads_b[name], rtol=1e-3, atol=1e-6), name


def test_dpo_training_raises_the_preference_margin():
    trajectories = _pairs_batch()
    learner = make_learner("learner.minibatches=3", "learner.micro_batch_size=2")
    assert learner.reference is not None
    first = learner.update_batch(trajectories)
    assert first["learner/trajectories"] == 2 * len(build_pairs(trajectories))
    assert first["learner/optimizer_steps"] == 3
    last = learner.update_batch(trajectories)
    assert last["learner/dpo_margin"] > first["learner/dpo_margin"]
    assert last["learner/dpo_loss"] < first["learner/dpo_loss"]


def test_a_batch_without_pairs_skips_the_update():
    learner = make_learner()
    before = {k: v.clone() for k, v in learner.policy.state_dict().items()}
    metrics = learner.update_batch(_episodes([(1, 1.0), (1, 1.0), (2, 0.0)]))
    assert metrics["learner/trajectories"] == 0.0
    assert all(torch.equal(before[k], v) for k, v in learner.policy.state_dict().items())


def test_dpo_rejects_token_mean_aggregation():
    with pytest.raises(ValueError, match="aggregation"):
        build_algorithm("dpo", {"aggregation": "token_mean"})

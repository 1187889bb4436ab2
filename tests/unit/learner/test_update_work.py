"""The learner does no work that cannot change the update: no second forward for a single on-policy step,
no reference model without a KL term, no forward or backward for groups whose rewards are all equal."""

import pytest
import torch

from agentgym_rl.actors.trajectory import Trajectory
from agentgym_rl.learner.algorithms import AlgorithmConfigError, build_algorithm
from tests.unit.learner.helpers import batch_of, two_turn_trajectory
from tests.unit.learner.test_learner import gradients, make_learner


def decoder_inputs(*models: torch.nn.Module) -> list[torch.Tensor]:
    """A list that every decoder forward of ``models`` appends its ``input_ids`` to."""
    seen: list[torch.Tensor] = []

    def hook(module, args, kwargs):
        seen.append(kwargs["input_ids"].detach().clone())

    for model in models:
        model.get_decoder().register_forward_pre_hook(hook, with_kwargs=True)
    return seen


def rows_of(seen: list[torch.Tensor]) -> int:
    return sum(len(ids) for ids in seen)


def test_one_on_policy_step_takes_its_old_logprobs_from_the_training_forward():
    trajectories = batch_of()  # 9 episodes, 3 groups
    fused = make_learner("grpo", "algorithm.kl_coef=0", "learner.micro_batch_size=9")
    recompute = make_learner(
        "grpo", "algorithm.kl_coef=0", "learner.micro_batch_size=9", "learner.old_logprobs=recompute"
    )
    assert fused.old_logprobs_source == "forward" and recompute.old_logprobs_source == "recompute"
    seen_fused, seen_recompute = decoder_inputs(fused.compute_policy), decoder_inputs(recompute.compute_policy)
    batch_f, batch_r = fused.prepare(trajectories), recompute.prepare(trajectories)
    metrics_f = fused.accumulate_gradients(batch_f, torch.arange(9))
    metrics_r = recompute.accumulate_gradients(batch_r, torch.arange(9))
    assert rows_of(seen_fused) == 9 and len(seen_fused) == 1  # the training forward only
    assert rows_of(seen_recompute) == 18 and len(seen_recompute) == 2  # a scoring pass, then the training forward
    # the same update: ratio denominators equal the current log-probs either way
    assert metrics_f["learner/loss"] == pytest.approx(metrics_r["learner/loss"], rel=1e-5, abs=1e-7)
    grads_f, grads_r = gradients(fused), gradients(recompute)
    for name in grads_r:
        assert torch.allclose(grads_f[name], grads_r[name], rtol=1e-4, atol=1e-7), name


@pytest.mark.parametrize(
    "overrides, source",
    [
        (["learner.epochs=2"], "recompute"),
        (["learner.minibatches=3"], "recompute"),
        (["algorithm.kl_mode=reward"], "recompute"),  # its advantages read the old log-probs
        (["learner.old_logprobs=sampler"], "sampler"),
        ([], "forward"),
    ],
)
def test_several_steps_or_advantages_that_read_old_logprobs_still_score_first(overrides, source):
    assert make_learner("grpo", *overrides).old_logprobs_source == source


def test_no_reference_model_and_no_reference_forward_without_kl():
    without = make_learner("grpo", "algorithm.kl_coef=0", "learner.micro_batch_size=9")
    assert without.reference is None and without.describe()["reference_model"] is False
    seen = decoder_inputs(without.compute_policy)
    without.update_batch(batch_of())
    assert len(seen) == 1  # one micro-batch, one forward: no reference, no scoring pass

    with_kl = make_learner("grpo", "algorithm.kl_coef=0.01", "learner.micro_batch_size=9")
    seen_policy, seen_reference = decoder_inputs(with_kl.compute_policy), decoder_inputs(with_kl.reference)
    metrics = with_kl.update_batch(batch_of())
    assert len(seen_reference) == 1 and len(seen_policy) == 1 and "learner/kl" in metrics


def group(g: torch.Generator, index: int, rewards: list[float]) -> list[Trajectory]:
    return [two_turn_trajectory(g, index, reward) for reward in rewards]


def test_a_group_with_equal_rewards_never_reaches_forward_or_backward():
    g = torch.Generator().manual_seed(3)
    informative = group(g, 0, [1.0, 0.0, 0.0])
    uniform = group(g, 1, [0.0, 0.0, 0.0])
    solved = group(g, 2, [1.0, 1.0, 1.0])
    learner = make_learner("grpo", "algorithm.kl_coef=0.01", "learner.micro_batch_size=1")
    seen = decoder_inputs(learner.compute_policy, learner.reference)
    metrics = learner.update_batch([*informative, *uniform, *solved])
    # one row per micro-batch, trimmed to its own length: a reference pass and a training forward per episode
    rows = [tuple(ids.tolist()) for batch in seen for ids in batch]
    assert len(rows) == 6 and set(rows) == {tuple(t.token_ids) for t in informative}
    assert metrics["learner/trajectories"] == 3 and metrics["learner/optimizer_steps"] == 1


def test_a_batch_of_uniform_groups_costs_nothing_and_keeps_the_version():
    g = torch.Generator().manual_seed(4)
    learner = make_learner("rloo", "algorithm.kl_mode=loss")
    seen = decoder_inputs(learner.compute_policy, learner.reference)
    before = {k: v.clone() for k, v in learner.policy.state_dict().items()}
    metrics = learner.update_batch([*group(g, 0, [0.0] * 3), *group(g, 1, [0.5] * 3)])
    assert seen == [] and metrics["learner/optimizer_steps"] == 0 and learner.version == 0
    assert all(torch.equal(before[k], v) for k, v in learner.policy.state_dict().items())


@pytest.mark.parametrize(
    "params, skipped",
    [
        ({}, {1, 2}),
        ({"skip_uniform_groups": False}, set()),
        ({"kl_mode": "reward"}, set()),  # the KL penalty makes the rewards differ: nothing is skipped
        ({"truncated": "zero_reward"}, {1, 2, 3}),  # group 3's only success was truncated: zero, so uniform
    ],
)
def test_grpo_skips_exactly_the_groups_whose_rewards_the_advantages_see_as_equal(params, skipped):
    g = torch.Generator().manual_seed(5)
    truncated_win = two_turn_trajectory(g, 3, 1.0, truncated=True)
    trajectories = [
        *group(g, 0, [1.0, 0.0]),
        *group(g, 1, [0.0, 0.0]),
        *group(g, 2, [0.7]),  # a group of one
        truncated_win,
        two_turn_trajectory(g, 3, 0.0),
    ]
    kept = build_algorithm("grpo", params).select_trajectories(trajectories)
    assert {t.group for t in trajectories} - {t.group for t in kept} == skipped


def test_skip_uniform_groups_cannot_be_asked_for_with_the_kl_reward_penalty():
    with pytest.raises(AlgorithmConfigError, match="skip_uniform_groups"):
        build_algorithm("grpo", {"kl_mode": "reward", "skip_uniform_groups": True})

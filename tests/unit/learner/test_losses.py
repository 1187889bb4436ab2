import math

import pytest
import torch

from agentgym_rl.learner.algorithms import GRPO, AlgorithmConfigError, build_algorithm
from agentgym_rl.learner.losses import (
    aggregate,
    cispo_policy_loss,
    clipped_policy_loss,
    clipped_value_loss,
    gspo_policy_loss,
    kl_penalty,
    masked_mean,
    rollout_correction_weights,
    sequence_ratios,
)


def test_clipped_policy_loss_by_hand():
    old = torch.zeros(1, 3)
    new = torch.log(torch.tensor([[1.5, 0.5, 1.1]]))
    adv = torch.tensor([[1.0, -1.0, 2.0]])
    loss, clipped = clipped_policy_loss(new, old, adv, clip_low=0.2, clip_high=0.2)
    # ratio 1.5, A=+1 -> -min(1.5, 1.2) = -1.2 (clipped); ratio 0.5, A=-1 -> -min(-0.5, -0.8) = 0.8 (clipped);
    # ratio 1.1, A=2 -> -2.2 (inside the clip range)
    assert torch.allclose(loss, torch.tensor([[-1.2, 0.8, -2.2]]), atol=1e-6)
    assert clipped.tolist() == [[1.0, 1.0, 0.0]]


def test_dual_clip_caps_negative_advantage_losses():
    new = torch.log(torch.tensor([[5.0, 5.0]]))
    adv = torch.tensor([[-1.0, 1.0]])
    loss, clipped = clipped_policy_loss(new, torch.zeros(1, 2), adv, clip_low=0.2, clip_high=0.2, dual_clip=3.0)
    # A<0, ratio 5: plain PPO loss is 5, dual clip caps it at 3; A>0 is unaffected (-1.2)
    assert torch.allclose(loss, torch.tensor([[3.0, -1.2]]))
    assert clipped.tolist() == [[1.0, 1.0]]


def test_clip_higher_bounds_are_asymmetric_by_hand():
    ratios = torch.tensor([[1.25, 1.3, 0.75, 0.7]])
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    loss, clipped = clipped_policy_loss(torch.log(ratios), torch.zeros(1, 4), adv, clip_low=0.2, clip_high=0.28)
    # A>0: 1.25 is inside [0.8, 1.28] -> -1.25; 1.3 is capped at 1.28. A<0: 0.75 is floored at 0.8 -> 0.8; 0.7 -> 0.8
    assert torch.allclose(loss, torch.tensor([[-1.25, -1.28, 0.8, 0.8]]))
    assert clipped.tolist() == [[0.0, 1.0, 1.0, 1.0]]
    symmetric, _ = clipped_policy_loss(torch.log(ratios), torch.zeros(1, 4), adv, clip_low=0.2, clip_high=0.2)
    assert symmetric[0, 0].item() == pytest.approx(-1.2)  # the symmetric clip would have capped the first


def test_gspo_sequence_ratio_by_hand():
    # row 0: log-ratios ln 2 and 0 on its two sampled tokens (the third is masked) -> s = exp(ln 2 / 2) = sqrt 2
    old = torch.zeros(2, 3)
    new = torch.tensor([[math.log(2.0), 0.0, 5.0], [math.log(0.5), math.log(0.5), 0.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    ratios = sequence_ratios(new, old, mask)
    assert torch.allclose(ratios, torch.tensor([2**0.5, 0.5]))
    adv = torch.tensor([[-1.0, -1.0, -1.0], [2.0, 2.0, 2.0]])
    loss, clipped = gspo_policy_loss(new, old, adv, mask, clip_low=3e-4, clip_high=4e-4)
    # row 0 (A<0, s above the range): the unclipped -s*A = sqrt 2 is the larger loss; row 1 (A>0, s = 0.5):
    # -0.5*2 = -1 beats -(1 - 3e-4)*2 = -1.9994, so both rows stay unclipped
    assert torch.allclose(loss[:, :2], torch.tensor([[2**0.5, 2**0.5], [-1.0, -1.0]]), atol=1e-6)
    assert clipped[:, :2].tolist() == [[0.0, 0.0], [0.0, 0.0]]
    # GSPO-token's gradient: d loss_t / d logp_t = -A * s on every token of the row
    (loss * mask).sum().backward()
    assert torch.allclose(new.grad[0, :2], torch.tensor([2**0.5, 2**0.5]), atol=1e-6)
    assert torch.allclose(new.grad[1, :2], torch.tensor([-1.0, -1.0]))
    # A>0 with s above the range: the whole row is clipped at 1 + 4e-4 and gets no gradient
    loss, clipped = gspo_policy_loss(new.detach(), old, adv.abs(), mask, clip_low=3e-4, clip_high=4e-4)
    assert torch.allclose(loss[0, :2], torch.tensor([-1.0004, -1.0004]))
    assert clipped[0, :2].tolist() == [1.0, 1.0]


@pytest.mark.parametrize("seed", [0, 1])
def test_sequence_ratios_equal_a_loop_over_episodes(seed):
    g = torch.Generator().manual_seed(seed)
    new, old = torch.randn(4, 9, generator=g), torch.randn(4, 9, generator=g)
    mask = (torch.rand(4, 9, generator=g) > 0.3).float()
    expected = []
    for b in range(4):
        sampled = [float(new[b, t] - old[b, t]) for t in range(9) if mask[b, t]]
        expected.append(math.exp(sum(sampled) / len(sampled)) if sampled else 1.0)
    assert torch.allclose(sequence_ratios(new, old, mask), torch.tensor(expected), rtol=1e-5)


def test_cispo_clips_the_weight_not_the_update():
    old = torch.zeros(1, 3)
    new = torch.log(torch.tensor([[2.0, 1.1, 0.5]])).requires_grad_()
    adv = torch.tensor([[1.0, 1.0, -1.0]])
    loss, clipped = cispo_policy_loss(new, old, adv, clip_low=1.0, clip_high=0.28)
    # weights: 2 -> 1.28 (clipped), 1.1 kept, 0.5 kept (no lower bound with clip_low = 1)
    weights = torch.tensor([[1.28, 1.1, 0.5]])
    assert torch.allclose(loss, -weights * adv * new.detach())
    assert clipped.tolist() == [[1.0, 0.0, 0.0]]
    loss.sum().backward()
    # the gradient is -weight * A on every token: the clipped token still learns (PPO's clip would zero it)
    assert torch.allclose(new.grad, torch.tensor([[-1.28, -1.1, 0.5]]))
    ppo_new = new.detach().clone().requires_grad_()
    ppo_loss, _ = clipped_policy_loss(ppo_new, old, adv, clip_low=0.2, clip_high=0.28)
    ppo_loss.sum().backward()
    assert ppo_new.grad[0, 0] == 0.0


def test_tis_caps_and_mis_masks_the_sampler_ratio_by_hand():
    sampler = torch.zeros(1, 4)
    old = torch.log(torch.tensor([[0.5, 1.5, 3.0, 2.0]]))  # rho = learner's old / sampler's probability
    tis, capped = rollout_correction_weights(old, sampler, "tis", cap=2.0)
    assert torch.allclose(tis, torch.tensor([[0.5, 1.5, 2.0, 2.0]]))
    assert capped.tolist() == [[0.0, 0.0, 1.0, 0.0]]
    mis, masked = rollout_correction_weights(old, sampler, "mis", cap=2.0)
    assert torch.allclose(mis, torch.tensor([[0.5, 1.5, 0.0, 2.0]]))  # above the cap: out of the loss
    assert masked.tolist() == [[0.0, 0.0, 1.0, 0.0]]
    none, _ = rollout_correction_weights(old, sampler, "none", cap=2.0)
    assert (none == 1).all()


def test_kl_estimators_by_hand():
    logp = torch.tensor([[math.log(0.5)]])
    ref = torch.tensor([[math.log(0.25)]])
    r = math.log(2.0)  # logp - ref
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(r)
    assert kl_penalty(logp, ref, "k2").item() == pytest.approx(r * r / 2)
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(math.exp(-r) + r - 1)
    assert (kl_penalty(torch.randn(4, 5), torch.randn(4, 5), "k3") >= 0).all()


def test_aggregation_token_mean_vs_seq_mean():
    values = torch.tensor([[1.0, 1.0, 1.0, 0.0], [4.0, 0.0, 0.0, 0.0], [7.0, 7.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.float32)
    assert aggregate(values, mask, "token_mean").item() == pytest.approx(7 / 4)
    # episode means 1 and 4; the third episode has no sampled token and does not count
    assert aggregate(values, mask, "seq_mean").item() == pytest.approx(2.5)
    assert masked_mean(values, torch.zeros_like(mask)).item() == 0.0


def test_clipped_value_loss_by_hand():
    values, old, returns = torch.tensor([[2.0]]), torch.tensor([[1.0]]), torch.tensor([[0.0]])
    assert clipped_value_loss(values, old, returns, clip=None).item() == pytest.approx(2.0)
    # clipped value 1.2 has error 1.44 < 4, so the unclipped error (4) is kept: 0.5 * 4
    assert clipped_value_loss(values, old, returns, clip=0.2).item() == pytest.approx(2.0)
    values = torch.tensor([[0.5]])
    # unclipped error 0.25, clipped value 0.8 -> 0.64: the larger one counts
    assert clipped_value_loss(values, old, returns, clip=0.2).item() == pytest.approx(0.32)


def _batch(truncated):
    return {
        "rewards": torch.tensor([1.0, 0.0, 1.0]),
        "groups": torch.tensor([0, 0, 0]),
        "counted": torch.ones(3),
        "truncated": torch.tensor(truncated),
        "loss_mask": torch.ones(3, 2),
        "token_rewards": torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 1.0]]),
    }


def test_truncated_episode_treatments():
    keep = build_algorithm("grpo", {"kl_coef": 0.0}).compute_advantages(_batch([False, False, True]))
    zero = build_algorithm("grpo", {"kl_coef": 0.0, "truncated": "zero_reward"})
    batch = _batch([False, False, True])
    zeroed = zero.compute_advantages(batch)
    assert batch["rewards"].tolist() == [1.0, 0.0, 0.0]
    assert zeroed[2, 0] < 0 < zeroed[0, 0]  # the truncated success now counts as a failure
    assert keep[2, 0] > 0
    dropped_batch = _batch([False, False, True])
    dropped = build_algorithm("grpo", {"kl_coef": 0.0, "truncated": "drop"}).compute_advantages(dropped_batch)
    assert dropped_batch["loss_mask"][2].sum() == 0 and (dropped[2] == 0).all()


def test_kl_as_reward_penalty_lowers_rewards_of_drifting_episodes():
    algo = build_algorithm("reinforce_pp", {"kl_coef": 0.5, "kl_mode": "reward", "kl_estimator": "k1"})
    batch = _batch([False, False, False])
    batch["old_logprobs"] = torch.tensor([[0.0, 0.0], [0.0, 0.0], [-1.0, -1.0]])
    batch["ref_logprobs"] = torch.tensor([[0.0, 0.0], [0.0, 0.0], [-2.0, -2.0]])
    algo.compute_advantages(batch)
    # episode 2 drifted by k1 = 1 per token: 0.5 per token taken off its rewards
    assert batch["token_rewards"][2].tolist() == [-0.5, 0.5]
    assert batch["rewards"].tolist() == [1.0, 0.0, 0.0]


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("grpo", {"gama": 0.9}, "algorithm.gama: unknown key"),
        ("ppo", {"lam": 2.0}, "algorithm.lam"),
        ("nope", {}, "registered: cispo, dpo, gigpo, grpo, gspo, ppo, reinforce_pp, rloo, sft"),
        ("os.path:join", {}, "not a subclass"),
        ("no_such_module:Algo", {}, "cannot be imported"),
    ],
)
def test_bad_algorithm_settings_are_named(name, params, message):
    with pytest.raises(AlgorithmConfigError, match=message):
        build_algorithm(name, params)


def test_registered_names_resolve_to_the_shipped_classes():
    assert isinstance(build_algorithm("grpo", {}), GRPO)
    assert build_algorithm("grpo", {}).needs_reference
    assert not build_algorithm("grpo", {"kl_coef": 0.0}).needs_reference
    assert build_algorithm("ppo", {}).needs_critic

import math

import pytest
import torch

from learner.algorithms import GRPO, AlgorithmConfigError, build_algorithm
from learner.losses import aggregate, clipped_policy_loss, clipped_value_loss, kl_penalty, masked_mean


def test_clipped_policy_loss_by_hand():
    old = torch.zeros(1, 3)
    new = torch.log(torch.tensor([[1.5, 0.5, 1.1]]))
    adv = torch.tensor([[1.0, -1.0, 2.0]])
    loss, clipped = clipped_policy_loss(new, old, adv, clip_eps=0.2)
    # ratio 1.5, A=+1 -> -min(1.5, 1.2) = -1.2 (clipped); ratio 0.5, A=-1 -> -min(-0.5, -0.8) = 0.8 (clipped);
    # ratio 1.1, A=2 -> -2.2 (inside the clip range)
    assert torch.allclose(loss, torch.tensor([[-1.2, 0.8, -2.2]]), atol=1e-6)
    assert clipped.tolist() == [[1.0, 1.0, 0.0]]


def test_dual_clip_caps_negative_advantage_losses():
    new = torch.log(torch.tensor([[5.0, 5.0]]))
    adv = torch.tensor([[-1.0, 1.0]])
    loss, clipped = clipped_policy_loss(new, torch.zeros(1, 2), adv, clip_eps=0.2, dual_clip=3.0)
    # A<0, ratio 5: plain PPO loss is 5, dual clip caps it at 3; A>0 is unaffected (-1.2)
    assert torch.allclose(loss, torch.tensor([[3.0, -1.2]]))
    assert clipped.tolist() == [[1.0, 1.0]]


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
        ("nope", {}, "registered: dpo, grpo, ppo, reinforce_pp, rloo, sft"),
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

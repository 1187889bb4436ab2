"""Estimators by hand on a two-turn batch, and vectorised scans against a plain reference loop.

Layout of the two-turn episode (targets; position t predicts token t+1):
    prompt -> [0] reply-1 [1, 2] env [3, 4] reply-2 [5, 6]
so the sampled-token mask is [0, 1, 1, 0, 0, 1, 1]; a turn's reward sits on its last sampled token.
"""

import pytest
import torch

from learner.advantages import (
    discounted_returns,
    gae,
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
    whiten,
)

MASK = torch.tensor([[0, 1, 1, 0, 0, 1, 1]], dtype=torch.float32)
# turn 1 earns 0.5 (on position 2), turn 2 earns 1.0 (on position 6)
REWARDS = torch.tensor([[0, 0, 0.5, 0, 0, 0, 1.0]])
# values off the mask are 9 to prove they are never read
VALUES = torch.tensor([[9, 1, 2, 9, 9, 3, 4]], dtype=torch.float32)


def test_grpo_groups_of_one_all_equal_and_mixed():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.5, 0.5, 2.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 2])
    # group 0: mean 0.25, unbiased std 0.5 -> 0.75/0.5, -0.25/0.5
    expected = torch.tensor([1.5, -0.5, -0.5, -0.5, 0.0, 0.0, 0.0])
    assert torch.allclose(grpo_advantages(rewards, groups, eps=0.0), expected)
    assert torch.allclose(grpo_advantages(rewards, groups, eps=0.0, normalize_std=False)[:4], rewards[:4] - 0.25)


def test_rloo_leave_one_out_by_hand():
    rewards = torch.tensor([1.0, 0.0, 0.5, 3.0, 3.0, 7.0])
    groups = torch.tensor([4, 4, 4, 9, 9, 1])
    # group 4: 1 - (0+0.5)/2 = 0.75; 0 - (1+0.5)/2 = -0.75; 0.5 - (1+0)/2 = 0
    expected = torch.tensor([0.75, -0.75, 0.0, 0.0, 0.0, 0.0])
    assert torch.allclose(rloo_advantages(rewards, groups), expected)


def test_discounted_returns_skip_environment_tokens():
    # gamma 0.5 per sampled token: G6 = 1, G5 = 0.5, G2 = 0.5 + 0.5 * 0.5 = 0.75, G1 = 0.375
    expected = torch.tensor([[0, 0.375, 0.75, 0, 0, 0.5, 1.0]])
    assert torch.allclose(discounted_returns(REWARDS, MASK, gamma=0.5), expected)


def test_reinforce_pp_whitens_over_sampled_tokens_of_the_batch():
    returns = torch.tensor([0.375, 0.75, 0.5, 1.0])
    whitened = (returns - returns.mean()) / returns.std(unbiased=False)
    adv = reinforce_pp_advantages(REWARDS, MASK, gamma=0.5)
    assert torch.allclose(adv[MASK.bool()], whitened, atol=1e-5)
    assert (adv[~MASK.bool()] == 0).all()


def test_gae_bootstraps_from_the_next_reply_by_hand():
    adv, returns = gae(REWARDS, VALUES, MASK, gamma=0.9, lam=0.8)
    # pos 6: 1 - 4 = -3
    # pos 5: 0 + 0.9*4 - 3 = 0.6;          A = 0.6 + 0.72*(-3) = -1.56
    # pos 2: 0.5 + 0.9*3 - 2 = 1.2 (V of pos 5, across the env segment); A = 1.2 + 0.72*(-1.56) = 0.0768
    # pos 1: 0 + 0.9*2 - 1 = 0.8;          A = 0.8 + 0.72*0.0768 = 0.855296
    expected = torch.tensor([[0, 0.855296, 0.0768, 0, 0, -1.56, -3.0]])
    assert torch.allclose(adv, expected, atol=1e-6)
    assert torch.allclose(returns, (expected + VALUES) * MASK, atol=1e-6)


def test_gae_with_lambda_one_is_return_minus_value():
    adv, _ = gae(REWARDS, VALUES, MASK, gamma=1.0, lam=1.0)
    returns = discounted_returns(REWARDS, MASK, gamma=1.0)
    assert torch.allclose(adv, (returns - VALUES) * MASK)


def _reference_gae(rewards, values, mask, gamma, lam):
    """Plain per-row loop over the sampled positions only."""
    out = torch.zeros_like(rewards)
    for b in range(rewards.shape[0]):
        positions = [t for t in range(rewards.shape[1]) if mask[b, t]]
        next_value, next_adv = 0.0, 0.0
        for t in reversed(positions):
            delta = rewards[b, t] + gamma * next_value - values[b, t]
            next_adv = delta + gamma * lam * next_adv
            next_value = values[b, t]
            out[b, t] = next_adv
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_vectorised_scans_equal_the_reference_loop(seed):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(5, 30, generator=g) > 0.4).float()
    rewards = torch.randn(5, 30, generator=g) * mask
    values = torch.randn(5, 30, generator=g)
    adv, _ = gae(rewards, values, mask, gamma=0.97, lam=0.9)
    assert torch.allclose(adv, _reference_gae(rewards, values, mask, 0.97, 0.9), atol=1e-5)
    assert torch.allclose(
        discounted_returns(rewards, mask, 0.97),
        _reference_gae(rewards, torch.zeros_like(values), mask, 0.97, 1.0),
        atol=1e-5,
    )


def test_whiten_ignores_masked_entries():
    values = torch.tensor([[1.0, 100.0, 3.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0]])
    assert torch.allclose(whiten(values, mask), torch.tensor([[-1.0, 0.0, 1.0]]), atol=1e-4)

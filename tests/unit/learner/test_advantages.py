"""Estimators by hand on a two-turn batch, and vectorised scans against a plain reference loop.

Layout of the two-turn episode (targets; position t predicts token t+1):
    prompt -> [0] reply-1 [1, 2] env [3, 4] reply-2 [5, 6]
so the sampled-token mask is [0, 1, 1, 0, 0, 1, 1]; a turn's reward sits on its last sampled token.
"""

import pytest
import torch

from agentgym_rl.learner.advantages import (
    discounted_returns,
    discounted_turn_returns,
    gae,
    gigpo_step_advantages,
    grpo_advantages,
    grpo_turn_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
    rloo_turn_advantages,
    spread_turns,
    turn_rewards,
    turn_states,
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


def test_an_episodes_later_segments_share_its_advantage_and_are_not_counted_again():
    # group 0 holds three episodes (rewards 1, 0, 0); the first also left two later segments (rows 3, 4)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0])
    groups = torch.tensor([0, 0, 0, 0, 0])
    counted = torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0])
    episodes = grpo_advantages(rewards[:3], groups[:3], eps=0.0)
    with_segments = grpo_advantages(rewards, groups, eps=0.0, counted=counted)
    assert torch.allclose(with_segments, torch.cat([episodes, episodes[:1], episodes[:1]]))
    assert not torch.allclose(grpo_advantages(rewards, groups, eps=0.0), with_segments)  # counted twice: skewed
    loo = rloo_advantages(rewards[:3], groups[:3])
    assert torch.allclose(rloo_advantages(rewards, groups, counted), torch.cat([loo, loo[:1], loo[:1]]))
    returns = rewards[:, None].repeat(1, 2)  # (B, K): outcome rewards, no discount
    per_turn = grpo_turn_advantages(returns, groups, eps=0.0, counted=counted)
    assert torch.allclose(per_turn, with_segments[:, None].repeat(1, 2))
    assert torch.allclose(rloo_turn_advantages(returns, groups, counted)[:, 0], torch.cat([loo, loo[:1], loo[:1]]))


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


# Three turns on one row (targets): prompt [0] reply-0 [1, 2] env [3] reply-1 [4] env [5] reply-2 [6, 7];
# the second row has one turn and padding. Rewards sit on each turn's last reply token.
TURN_IDS = torch.tensor([[-1, 0, 0, -1, 1, -1, 2, 2], [-1, 0, 0, 0, -1, -1, -1, -1]])
TURN_REWARDS = torch.tensor([[0, 0, 0.5, 0, 0, 0, 0, 1.0], [0, 0, 0, 2.0, 0, 0, 0, 0]])


def test_turn_returns_discount_per_turn_by_hand():
    per_turn = turn_rewards(TURN_REWARDS, TURN_IDS)
    assert per_turn.tolist() == [[0.5, 0.0, 1.0], [2.0, 0.0, 0.0]]
    returns = discounted_turn_returns(per_turn, gamma=0.5)
    # row 0: G2 = 1, G1 = 0 + 0.5 * 1 = 0.5, G0 = 0.5 + 0.5 * 0.5 = 0.75 (three turns, not eight tokens)
    assert torch.allclose(returns, torch.tensor([[0.75, 0.5, 1.0], [2.0, 0.0, 0.0]]))
    tokens = spread_turns(returns, TURN_IDS)
    assert torch.allclose(tokens[0], torch.tensor([0, 0.75, 0.75, 0, 0.5, 0, 1.0, 1.0]))
    assert torch.allclose(tokens[1], torch.tensor([0, 2.0, 2.0, 2.0, 0, 0, 0, 0]))


def test_grpo_and_rloo_turn_credit_by_hand():
    # one group of two: turn returns (gamma 0.5) [0.75, 0.5, 1] and [2]; episode returns G0 = 0.75 and 2
    returns = discounted_turn_returns(turn_rewards(TURN_REWARDS, TURN_IDS), gamma=0.5)
    groups = torch.tensor([0, 0])
    # mean G0 = 1.375, unbiased std = 1.25 / sqrt(2) = 0.883883
    grpo = grpo_turn_advantages(returns, groups, eps=0.0)
    std = 1.25 / 2**0.5
    assert torch.allclose(grpo[0], torch.tensor([-0.625, -0.875, -0.375]) / std, atol=1e-6)
    assert grpo[1, 0].item() == pytest.approx(0.625 / std)
    assert torch.allclose(grpo_turn_advantages(returns, groups, eps=0.0, normalize_std=False)[0], returns[0] - 1.375)
    # RLOO: the other episode's G0 is the baseline: 2 for row 0, 0.75 for row 1
    rloo = rloo_turn_advantages(returns, groups)
    assert torch.allclose(rloo[0], torch.tensor([-1.25, -1.5, -1.0]))
    assert rloo[1, 0].item() == pytest.approx(1.25)
    # a group of one gets nothing
    assert (grpo_turn_advantages(returns, torch.tensor([0, 1]), eps=0.0) == 0).all()
    assert (rloo_turn_advantages(returns, torch.tensor([0, 1])) == 0).all()


def test_turn_credit_with_outcome_rewards_and_no_discount_is_outcome_credit():
    mask = (TURN_IDS >= 0).float()
    outcome = torch.tensor([[0, 0, 0, 0, 0, 0, 0, 1.0], [0, 0, 0, 0.0, 0, 0, 0, 0]])  # success, failure
    returns = discounted_turn_returns(turn_rewards(outcome, TURN_IDS), gamma=1.0)
    groups = torch.tensor([0, 0])
    rewards = outcome.sum(-1)
    grpo = spread_turns(grpo_turn_advantages(returns, groups, eps=1e-6), TURN_IDS)
    assert torch.allclose(grpo, grpo_advantages(rewards, groups, eps=1e-6)[:, None] * mask)
    rloo = spread_turns(rloo_turn_advantages(returns, groups), TURN_IDS)
    assert torch.allclose(rloo, rloo_advantages(rewards, groups)[:, None] * mask)


def test_gigpo_anchor_state_groups_by_hand():
    # Group 0, two episodes that both succeed, sharing states s0, s1, s2 (gamma 0.5 per turn):
    #   A: s0 -> s1 -> s2, rewards 0, 0, 1     -> returns 0.25, 0.5, 1
    #   B: s0 -> s1 -> s1 -> s2, rewards 0, 0, 0, 1 (a wasted turn at s1) -> 0.125, 0.25, 0.5, 1
    # Group 1, episode C acts from s0 as well (same id), but is compared only within its own group.
    returns = discounted_turn_returns(torch.tensor([[0, 0, 1.0, 0], [0, 0, 0, 1.0], [1.0, 0, 0, 0]]), gamma=0.5)
    states = torch.tensor([[0, 1, 2, -1], [0, 1, 1, 2], [0, -1, -1, -1]])
    groups = torch.tensor([0, 0, 1])
    step, shared = gigpo_step_advantages(returns, states, groups, eps=0.0, normalize_std=False)
    # s0: {0.25, 0.125}, mean 0.1875; s1: {0.5, 0.25, 0.5}, mean 5/12; s2: {1, 1}: all equal; C alone: 0
    expected = torch.tensor([[0.0625, 0.5 - 5 / 12, 0, 0], [-0.0625, 0.25 - 5 / 12, 0.5 - 5 / 12, 0], [0, 0, 0, 0]])
    assert torch.allclose(step, expected, atol=1e-6)
    assert shared.tolist() == [[True, True, True, False], [True, True, True, True], [False, False, False, False]]
    normalised, _ = gigpo_step_advantages(returns, states, groups, eps=0.0)
    # s0: std 0.125 / sqrt(2) -> +-1/sqrt(2); s1: centred (1/12, -1/6, 1/12), std sqrt(1/48) -> (0.577, -1.155, 0.577)
    assert torch.allclose(normalised[:2, :2], torch.tensor([[0.707107, 0.57735], [-0.707107, -1.154701]]), atol=1e-5)
    assert normalised[1, 2].item() == pytest.approx(0.57735, abs=1e-5)
    # both episodes succeed, so the episode level gives 0 and the step level alone ranks their turns


def test_turn_states_read_each_turns_state_off_its_tokens():
    state_ids = torch.tensor([[-1, 4, 4, -1, -1, -1, 7, 7], [-1, 4, 4, 4, -1, -1, -1, -1]])
    assert turn_states(state_ids, TURN_IDS).tolist() == [[4, -1, 7], [4, -1, -1]]


def _reference_turn_returns(rewards, turn_ids, gamma):
    """Per row: sum the rewards of each turn, then discount backwards over the turns."""
    out = {}
    for b in range(rewards.shape[0]):
        per_turn = {}
        for t in range(rewards.shape[1]):
            if turn_ids[b, t] >= 0:
                per_turn[int(turn_ids[b, t])] = per_turn.get(int(turn_ids[b, t]), 0.0) + float(rewards[b, t])
        running = 0.0
        for k in sorted(per_turn, reverse=True):
            running = per_turn[k] + gamma * running
            out[(b, k)] = running
    return out


def _reference_gigpo(returns, states, groups, eps):
    """Plain loop: collect the step groups as dicts, then normalise each turn within its group."""
    members = {}
    for b in range(returns.shape[0]):
        for k in range(returns.shape[1]):
            if states[b, k] >= 0:
                members.setdefault((int(groups[b]), int(states[b, k])), []).append((b, k))
    out = torch.zeros_like(returns)
    for turns in members.values():
        values = torch.tensor([float(returns[b, k]) for b, k in turns])
        if len(turns) > 1 and values.std() > 0:
            for (b, k), v in zip(turns, values, strict=True):
                out[b, k] = (v - values.mean()) / (values.std() + eps)
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_vectorised_turn_estimators_equal_the_reference_loop(seed):
    g = torch.Generator().manual_seed(seed)
    rows, width = 6, 40
    turn_ids = torch.full((rows, width), -1, dtype=torch.long)
    for b in range(rows):
        position, turn = 1, 0
        while position < width - 2:
            length = int(torch.randint(1, 5, (1,), generator=g))
            turn_ids[b, position : position + length] = turn
            position += length + int(torch.randint(1, 4, (1,), generator=g))
            turn += 1
    rewards = torch.randn(rows, width, generator=g) * (turn_ids >= 0)
    returns = discounted_turn_returns(turn_rewards(rewards, turn_ids), gamma=0.9)
    reference = _reference_turn_returns(rewards, turn_ids, 0.9)
    for (b, k), value in reference.items():
        assert returns[b, k].item() == pytest.approx(value, abs=1e-5)
    states = torch.randint(-1, 3, returns.shape, generator=g)
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    step, _ = gigpo_step_advantages(returns, states, groups, eps=1e-6)
    assert torch.allclose(step, _reference_gigpo(returns, states, groups, 1e-6), atol=1e-5)

import math

import pytest
import torch

from actors.trajectory import Trajectory
from learner.batching import collate, select_rows
from learner.losses import clipped_policy_loss, group_normalized_advantages, low_variance_kl, masked_mean


def test_group_advantages_by_hand():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 0.5, 0.5, 2.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 2])
    adv = group_normalized_advantages(rewards, groups, eps=0.0)
    # group 0: mean 0.25, sample std sqrt(0.25) = 0.5 -> (0.75/0.5, -0.25/0.5 x3)
    assert torch.allclose(adv[:4], torch.tensor([1.5, -0.5, -0.5, -0.5]))
    # all-equal group and a group of one carry no signal
    assert torch.equal(adv[4:], torch.zeros(3))


def test_group_advantages_do_not_depend_on_row_order():
    rewards = torch.tensor([0.3, 0.9, 0.1, 0.7])
    groups = torch.tensor([1, 0, 1, 0])
    adv = group_normalized_advantages(rewards, groups, eps=1e-6)
    perm = torch.tensor([3, 0, 2, 1])
    assert torch.allclose(group_normalized_advantages(rewards[perm], groups[perm], eps=1e-6), adv[perm])


def test_clipped_policy_loss_by_hand():
    old = torch.zeros(1, 3)
    new = torch.log(torch.tensor([[1.5, 0.5, 1.1]]))
    adv = torch.tensor([[1.0, -1.0, 2.0]])
    loss, clipped = clipped_policy_loss(new, old, adv, clip_eps=0.2)
    # ratio 1.5, A=+1 -> min(1.5, 1.2) = 1.2 (clipped); ratio 0.5, A=-1 -> min(-0.5, -0.8) = -0.8 (clipped);
    # ratio 1.1, A=2 -> 2.2 (inside the clip range)
    assert torch.allclose(loss, torch.tensor([[-1.2, 0.8, -2.2]]), atol=1e-6)
    assert clipped.tolist() == [[1.0, 1.0, 0.0]]


def test_low_variance_kl_by_hand():
    logp = torch.tensor([[math.log(0.5), math.log(0.2)]])
    ref = torch.tensor([[math.log(0.25), math.log(0.2)]])
    kl = low_variance_kl(logp, ref)
    r = math.log(0.5)  # ref - logp for the first token
    assert kl[0, 0].item() == pytest.approx(math.exp(r) - r - 1, rel=1e-5)
    assert kl[0, 1].item() == pytest.approx(0.0, abs=1e-7)
    assert (low_variance_kl(torch.randn(4, 5), torch.randn(4, 5)) >= 0).all()


def test_masked_mean_ignores_masked_positions_and_empty_masks():
    values = torch.tensor([[1.0, 100.0, 3.0]])
    assert masked_mean(values, torch.tensor([[1, 0, 1]])).item() == 2.0
    assert masked_mean(values, torch.zeros(1, 3)).item() == 0.0


def _trajectory(token_ids, loss_mask, reward, group=0):
    return Trajectory(
        env="babyai",
        task_id=0,
        group=group,
        token_ids=token_ids,
        loss_mask=loss_mask,
        logprobs=[-0.5 if m else 0.0 for m in loss_mask],
        prompt_length=2,
        turn_spans=[],
        messages=[],
        actions=[],
        step_rewards=[reward],
        reward=reward,
        success=reward > 0,
        done=True,
        truncated=False,
        horizon=2,
        weights_version=0,
    )


def test_collate_puts_the_outcome_on_the_last_sampled_token():
    # prompt(2) reply(2) env(2) reply(1) env(1): the last sampled token is index 6, not the final env token
    first = _trajectory([5, 6, 7, 8, 9, 10, 11, 12], [0, 0, 1, 1, 0, 0, 1, 0], reward=1.0)
    second = _trajectory([5, 6, 7, 8], [0, 0, 1, 1], reward=0.5, group=1)
    batch = collate([first, second], pad_token_id=0)
    assert batch["input_ids"].shape == (2, 8)
    # targets are shifted by one: target position t predicts token t+1
    assert batch["loss_mask"][0].tolist() == [0, 1, 1, 0, 0, 1, 0]
    assert batch["token_rewards"][0].tolist() == [0, 0, 0, 0, 0, 1.0, 0]
    assert batch["token_rewards"][1].tolist() == [0, 0, 0.5, 0, 0, 0, 0]
    assert batch["attention_mask"][1].tolist() == [1, 1, 1, 1, 0, 0, 0, 0]
    part = select_rows(batch, slice(1, 2))
    assert part["input_ids"].shape == (1, 4) and part["loss_mask"].shape == (1, 3)

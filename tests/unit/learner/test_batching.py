import torch

from agentgym_rl.learner.batching import collate, pack, plan_rows, select_rows, unpack_targets
from tests.unit.learner.helpers import two_turn_trajectory


def test_turn_rewards_sit_on_each_turns_last_sampled_token():
    g = torch.Generator().manual_seed(0)
    traj = two_turn_trajectory(g, group=3, reward=1.0)
    traj = traj.model_copy(update={"step_rewards": [0.25, 0.75]})
    batch = collate([traj], pad_token_id=0)
    (_s1, e1), (_s2, e2) = traj.turn_spans
    rewards = batch["token_rewards"][0]
    assert rewards[e1 - 2] == 0.25 and rewards[e2 - 2] == 0.75
    assert rewards.sum() == 1.0
    # every rewarded target position is a sampled token
    assert (batch["loss_mask"][0][rewards != 0] == 1).all()
    assert batch["groups"].tolist() == [3]


def test_pack_then_unpack_restores_every_target():
    g = torch.Generator().manual_seed(1)
    trajectories = [two_turn_trajectory(g, group=i, reward=1.0) for i in range(5)]
    batch = collate(trajectories, pad_token_id=0)
    lengths = batch["attention_mask"].sum(-1)
    rows = plan_rows(lengths.tolist(), capacity=int(lengths.max()) * 2)
    assert sorted(i for row in rows for i in row) == list(range(5))
    assert all(sum(int(lengths[i]) for i in row) <= int(lengths.max()) * 2 for row in rows)
    packed = pack(batch["input_ids"], lengths, batch["loss_mask"], rows, pad_token_id=0)
    assert packed.target_mask.sum() == batch["loss_mask"].sum()
    restored = unpack_targets(packed.target_mask, packed, batch["loss_mask"].shape)
    assert torch.equal(restored, batch["loss_mask"])
    # each token attends only inside its own sequence
    for r, placed in enumerate(packed.segments):
        (_first, offset, n) = placed[0]
        if len(placed) > 1:
            _, offset2, _ = placed[1]
            assert not packed.attention_mask[r, 0, offset2, offset].item()
        assert packed.position_ids[r, offset + n - 1] == n - 1


def test_select_rows_trims_to_the_longest_member():
    g = torch.Generator().manual_seed(2)
    trajectories = [two_turn_trajectory(g, group=i, reward=0.0) for i in range(4)]
    batch = collate(trajectories, pad_token_id=0)
    part = select_rows(batch, torch.tensor([2, 0]))
    width = max(len(trajectories[i].token_ids) for i in (0, 2))
    assert part["input_ids"].shape == (2, width) and part["loss_mask"].shape == (2, width - 1)

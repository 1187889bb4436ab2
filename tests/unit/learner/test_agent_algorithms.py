"""GiGPO, turn-level credit, GSPO/CISPO, clip-higher, overlong shaping and rollout correction as algorithms:
hand-made trajectories through ``collate`` and ``compute_advantages``/``compute_loss``, by hand."""

import math

import pytest
import torch

from agentgym_rl.actors.trajectory import Trajectory
from agentgym_rl.learner.advantages import whiten
from agentgym_rl.learner.algorithms import CISPO, GSPO, AlgorithmConfigError, GiGPO, build_algorithm
from agentgym_rl.learner.batching import collate
from tests.factories import make_trajectory
from tests.unit.learner.helpers import two_turn_trajectory


def episode(
    group: int,
    step_rewards: list[float],
    state_keys: list[str | None] | None = None,
    *,
    capped: list[bool] | None = None,
    truncated: bool = False,
) -> Trajectory:
    """A hand-made episode: a 2-token prompt, then per turn a 2-token reply and (between turns) 1 env token."""
    ids, mask = [1, 2], [0, 0]
    for k in range(len(step_rewards)):
        if k:
            ids.append(3)
            mask.append(0)
        ids += [10 + k, 20 + k]
        mask += [1, 1]
    return make_trajectory(
        ids,
        mask,
        step_rewards,
        group=group,
        state_keys=state_keys or [],
        turn_capped=capped or [],
        truncated=truncated,
        truncation_reason=None,
    )


def per_turn(batch: dict[str, torch.Tensor], advantages: torch.Tensor, row: int) -> list[float]:
    """The advantage of each turn of ``row`` (every reply token of a turn carries the same one)."""
    values = []
    for turn in range(int(batch["turn_ids"][row].max()) + 1):
        on_turn = advantages[row][batch["turn_ids"][row] == turn]
        assert torch.allclose(on_turn, on_turn[0].expand_as(on_turn))
        values.append(float(on_turn[0]))
    return values


def test_gigpo_anchor_state_groups_on_a_hand_made_batch():
    # Group 0: A and B succeed through the shared states s0, s1, s2 (B wastes a turn at s1); C fails from s0.
    # Group 1: D also starts from a state keyed "s0" but is compared only within its own group (alone: 0).
    trajectories = [
        episode(0, [0, 0, 1], ["s0", "s1", "s2"]),
        episode(0, [0, 0, 0, 1], ["s0", "s1", "s1", "s2"]),
        episode(0, [0, 0], ["s0", "x"]),
        episode(1, [1], ["s0"]),
    ]
    algo = build_algorithm("gigpo", {"gamma": 0.5, "normalize_std": False, "kl_coef": 0.0})
    batch = collate(trajectories, pad_token_id=0)
    advantages = algo.compute_advantages(batch)
    # episode level (mean_norm): rewards 1, 1, 0 -> +1/3, +1/3, -2/3; D is a group of one -> 0
    # step level, turn returns with gamma 0.5: A 0.25, 0.5, 1; B 0.125, 0.25, 0.5, 1; C 0, 0
    #   s0: {0.25, 0.125, 0} mean 0.125 -> +0.125, 0, -0.125; s1: {0.5, 0.25, 0.5} mean 5/12 -> +1/12, -1/6, +1/12
    #   s2: {1, 1} -> 0; x alone -> 0
    third = 1 / 3
    expected = [
        [third + 0.125, third + 1 / 12, third],
        [third, third - 1 / 6, third + 1 / 12, third],
        [-2 * third - 0.125, -2 * third],
        [0.0],
    ]
    for row, values in enumerate(expected):
        assert per_turn(batch, advantages, row) == pytest.approx(values, abs=1e-6)
    assert (advantages[batch["loss_mask"] == 0] == 0).all()
    # every turn of group 0 but C's "x" has a step-group partner
    assert batch["anchored"].sum() == 2 * (3 + 4 + 1)


def test_gigpo_without_state_keys_is_grpo():
    trajectories = [episode(0, [0, 1]), episode(0, [0, 0]), episode(1, [1]), episode(1, [0, 0, 0])]
    gigpo = build_algorithm("gigpo", {"kl_coef": 0.0}).compute_advantages(collate(trajectories, 0))
    grpo = build_algorithm("grpo", {"kl_coef": 0.0}).compute_advantages(collate(trajectories, 0))
    assert torch.allclose(gigpo, grpo)
    assert isinstance(build_algorithm("gigpo", {}), GiGPO) and build_algorithm("gigpo", {}).uses_state_keys


def test_gigpo_keeps_a_uniform_reward_group_whose_shared_states_rank_turns():
    wins = [episode(0, [0, 1], ["s0", "s1"]), episode(0, [0, 0, 1], ["s0", "s0", "s1"])]  # B wastes a turn
    losses = [episode(1, [0, 0], ["s0", "s1"]), episode(1, [0, 0], ["s0", "s1"])]
    trajectories = [*wins, *losses]
    assert build_algorithm("grpo", {}).select_trajectories(trajectories) == []
    assert build_algorithm("gigpo", {}).select_trajectories(trajectories) == wins
    # GRPO's turn-level credit with a discount also ranks the shorter success higher
    assert build_algorithm("grpo", {"credit": "turn", "turn_gamma": 0.9}).select_trajectories(trajectories) == wins


def test_gigpo_skips_a_uniform_reward_group_whose_step_groups_are_level_too():
    # Group 0: both episodes take one path; group 1: the same length through different states, so no state
    # is shared at a different return; group 2: one episode wins. Only group 2 gets a nonzero advantage.
    same_path = [episode(0, [0, 0, 1], ["s0", "s1", "s2"]), episode(0, [0, 0, 1], ["s0", "s1", "s2"])]
    same_length = [episode(1, [0, 1], ["s0", "a"]), episode(1, [0, 1], ["s0", "b"])]
    mixed = [episode(2, [0, 1], ["s0", "s1"]), episode(2, [0, 0], ["s0", "s1"])]
    algo = build_algorithm("gigpo", {})
    batch = collate([*same_path, *same_length, *mixed], pad_token_id=0)
    advantages = algo.compute_advantages(batch)
    assert (advantages[:4] == 0).all() and (advantages[4:][batch["loss_mask"][4:] == 1] != 0).all()
    assert algo.select_trajectories([*same_path, *same_length, *mixed]) == mixed


def test_turn_credit_uses_the_per_turn_rewards_with_a_turn_discount():
    trajectories = [episode(0, [0.5, 0.0, 1.0]), episode(0, [2.0])]
    batch = collate(trajectories, pad_token_id=0)
    # returns (turn_gamma 0.5): [0.75, 0.5, 1.0] and [2.0]; episode returns 0.75 and 2 (mean 1.375)
    rloo = build_algorithm("rloo", {"credit": "turn", "turn_gamma": 0.5, "kl_coef": 0.0})
    assert per_turn(batch, rloo.compute_advantages(batch), 0) == pytest.approx([-1.25, -1.5, -1.0])
    grpo = build_algorithm("grpo", {"credit": "turn", "turn_gamma": 0.5, "kl_coef": 0.0, "normalize_std": False})
    batch = collate(trajectories, pad_token_id=0)
    assert per_turn(batch, grpo.compute_advantages(batch), 0) == pytest.approx([-0.625, -0.875, -0.375])
    rpp = build_algorithm("reinforce_pp", {"credit": "turn", "turn_gamma": 0.5, "kl_coef": 0.0})
    batch = collate(trajectories, pad_token_id=0)
    advantages = rpp.compute_advantages(batch)
    mask = batch["loss_mask"]
    returns = torch.zeros_like(mask)
    for row, values in enumerate([[0.75, 0.5, 1.0], [2.0]]):
        for turn, value in enumerate(values):
            returns[row][batch["turn_ids"][row] == turn] = value
    assert torch.allclose(advantages, whiten(returns, mask), atol=1e-6)


def test_outcome_credit_stays_the_default_and_turn_keys_are_checked():
    assert build_algorithm("grpo", {}).config.credit == "outcome"
    with pytest.raises(AlgorithmConfigError, match="turn_gamma"):
        build_algorithm("rloo", {"turn_gamma": 0.9})
    with pytest.raises(AlgorithmConfigError, match="turn_gamma instead"):
        build_algorithm("reinforce_pp", {"credit": "turn", "gamma": 0.9})
    with pytest.raises(AlgorithmConfigError, match="dual_clip"):
        build_algorithm("grpo", {"policy_loss": "gspo", "dual_clip": 3.0})


def test_overlong_penalty_lands_on_the_cut_turn_and_counts_for_group_selection():
    trajectories = [episode(0, [0.0, 1.0], capped=[True, False]), episode(0, [0.0, 1.0], capped=[False, False])]
    plain = build_algorithm("grpo", {"kl_coef": 0.0})
    assert plain.select_trajectories(trajectories) == []  # equal rewards
    shaped = build_algorithm("grpo", {"kl_coef": 0.0, "overlong_penalty": 0.5})
    assert shaped.select_trajectories(trajectories) == trajectories  # 0.5 vs 1.0 as the advantages see them
    batch = collate(trajectories, pad_token_id=0)
    advantages = shaped.compute_advantages(batch)
    (start, end), _ = trajectories[0].turn_spans
    assert batch["token_rewards"][0, end - 2].item() == pytest.approx(-0.5)  # on the cut reply's last token
    assert batch["rewards"].tolist() == [0.5, 1.0]
    assert advantages[0, start - 1] < 0 < advantages[1, start - 1]


def test_gspo_and_cispo_are_grpo_with_their_papers_losses():
    gspo, cispo = build_algorithm("gspo", {}), build_algorithm("cispo", {})
    assert isinstance(gspo, GSPO) and isinstance(cispo, CISPO)
    assert (gspo.config.policy_loss, gspo.config.clip_range, gspo.config.aggregation) == (
        "gspo",
        (3e-4, 4e-4),
        "seq_mean",
    )
    assert (cispo.config.policy_loss, cispo.config.clip_range, cispo.config.aggregation) == (
        "cispo",
        (1.0, 0.28),
        "token_mean",
    )
    grpo = build_algorithm("grpo", {})
    assert (grpo.config.policy_loss, grpo.config.clip_range, grpo.config.rollout_correction) == (
        "ppo",
        (0.2, 0.2),
        "none",
    )


def _loss_batch(old: torch.Tensor, sampler: torch.Tensor) -> dict[str, torch.Tensor]:
    return {
        "loss_mask": torch.ones_like(old),
        "advantages": torch.ones_like(old),
        "old_logprobs": old,
        "sampler_logprobs": sampler,
    }


def test_tis_weights_the_surrogate_and_reports_its_metrics():
    old = torch.log(torch.tensor([[0.5, 3.0]]))
    forward = {"logprobs": old.clone(), "entropy": torch.zeros_like(old)}
    plain = build_algorithm("grpo", {"kl_coef": 0.0})
    tis = build_algorithm("grpo", {"kl_coef": 0.0, "rollout_correction": "tis", "rollout_correction_cap": 2.0})
    mis = build_algorithm("grpo", {"kl_coef": 0.0, "rollout_correction": "mis", "rollout_correction_cap": 2.0})
    loss_plain, metrics_plain = plain.compute_loss(_loss_batch(old, torch.zeros_like(old)), forward)
    loss_tis, metrics = tis.compute_loss(_loss_batch(old, torch.zeros_like(old)), forward)
    loss_mis, _ = mis.compute_loss(_loss_batch(old, torch.zeros_like(old)), forward)
    # ratio 1, A = 1: plain per-token loss -1; rho = 0.5 and 3 -> TIS weights 0.5 and 2, MIS 0.5 and 0
    assert loss_plain.item() == pytest.approx(-1.0)
    assert loss_tis.item() == pytest.approx(-(0.5 + 2.0) / 2)
    assert loss_mis.item() == pytest.approx(-0.5 / 2)
    assert metrics["learner/rollout_is_weight_mean"] == pytest.approx(1.25)
    assert metrics["learner/rollout_is_ratio_mean"] == pytest.approx(1.75)
    assert metrics["learner/rollout_is_capped_frac"] == pytest.approx(0.5)
    assert not any(key.startswith("learner/rollout_is") for key in metrics_plain)


def test_collate_carries_turn_ids_state_ids_and_cut_replies():
    g = torch.Generator().manual_seed(0)
    first = two_turn_trajectory(g, group=0, reward=1.0).model_copy(
        update={"state_keys": ["k1", "k2"], "turn_capped": [False, True]}
    )
    second = two_turn_trajectory(g, group=0, reward=0.0).model_copy(update={"state_keys": ["k2", None]})
    batch = collate([first, second, two_turn_trajectory(g, group=1, reward=0.0)], pad_token_id=0)
    for row, (trajectory, states) in enumerate(zip([first, second], [[0, 1], [1, -1]], strict=True)):
        for turn, ((start, end), state) in enumerate(zip(trajectory.turn_spans, states, strict=True)):
            assert (batch["turn_ids"][row, start - 1 : end - 1] == turn).all()
            assert (batch["state_ids"][row, start - 1 : end - 1] == state).all()
    assert torch.equal(batch["turn_ids"] >= 0, batch["loss_mask"].bool())
    assert (batch["state_ids"][2] == -1).all()  # a record without state keys (made before they existed)
    (_, end) = first.turn_spans[1]
    assert batch["turn_capped"][0].nonzero().flatten().tolist() == [end - 2]
    assert batch["turn_capped"][1:].sum() == 0


def test_sequence_ratio_clip_uses_the_whole_episode():
    # the GSPO surrogate through the algorithm: one episode whose tokens moved by ln 2 and 0 (s = sqrt 2)
    old = torch.zeros(1, 2)
    forward = {"logprobs": torch.tensor([[math.log(2.0), 0.0]]), "entropy": torch.zeros(1, 2)}
    batch = {**_loss_batch(old, old), "advantages": torch.tensor([[1.0, 1.0]])}
    loss, metrics = build_algorithm("gspo", {"kl_coef": 0.0}).compute_loss(batch, forward)
    assert loss.item() == pytest.approx(-(1 + 4e-4))  # A > 0 and s above 1 + 4e-4: clipped
    assert metrics["learner/pg_clipfrac"] == 1.0

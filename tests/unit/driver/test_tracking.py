"""Which trajectories a run keeps on disk (logging.max_trajectories_per_iteration)."""

import pytest

from agentgym_rl.actors.trajectory import Trajectory
from agentgym_rl.configs import Config
from agentgym_rl.driver.tracking import conversation_text, select_trajectories
from tests.factories import make_trajectory


def episode(group: int, success: bool) -> Trajectory:
    return make_trajectory(
        [1, 2, 3],
        [0, 1, 1],
        [1.0 if success else 0.0],
        group=group,
        logprobs=[0.0, -0.5, -0.5],
        messages=[{"role": "system", "content": "s"}, {"role": "user", "content": f"obs {group}"}],
        actions=["Action: go"],
        truncated=not success,
        horizon=3,
    )


BATCH = [episode(i, success=i in (3, 7, 8)) for i in range(12)]


def test_zero_and_large_limits_keep_everything():
    assert select_trajectories(BATCH, 0, seed=0, iteration=0) == BATCH
    assert select_trajectories(BATCH, 12, seed=0, iteration=0) == BATCH


def test_successes_are_always_kept_and_order_is_preserved():
    for iteration in range(5):
        kept = select_trajectories(BATCH, 5, seed=0, iteration=iteration)
        groups = [t.group for t in kept]
        assert len(kept) == 5
        assert {3, 7, 8} <= set(groups)
        assert groups == sorted(groups)


def test_choice_depends_only_on_seed_and_iteration():
    first = [t.group for t in select_trajectories(BATCH, 5, seed=4, iteration=2)]
    again = [t.group for t in select_trajectories(BATCH, 5, seed=4, iteration=2)]
    assert first == again
    draws = {tuple(t.group for t in select_trajectories(BATCH, 5, seed=4, iteration=i)) for i in range(20)}
    assert len(draws) > 1  # failures are drawn afresh each iteration, not always the first ones


def test_more_successes_than_the_limit_keeps_only_successes():
    kept = select_trajectories(BATCH, 2, seed=0, iteration=0)
    assert len(kept) == 2 and all(t.success for t in kept)


def test_conversation_text_lists_roles():
    assert conversation_text(BATCH[0]) == "system: s\n\nuser: obs 0"


def test_config_rejects_negative_limit_and_unknown_wandb_keys():
    with pytest.raises(ValueError, match="max_trajectories_per_iteration"):
        Config.model_validate({"logging": {"max_trajectories_per_iteration": -1}})
    with pytest.raises(ValueError, match="projet"):
        Config.model_validate({"logging": {"wandb": {"projet": "x"}}})
    assert Config().logging.wandb.mode == "offline" and not Config().logging.wandb.enabled

"""The policy-loss registry: the shipped surrogates by name, a loss by path, and lookups that fail."""

from __future__ import annotations

import pytest
import torch

from agentgym_rl.learner import PolicyGradientParams, build_algorithm, policy_loss_names
from agentgym_rl.learner.algorithms import AlgorithmConfigError, resolve_policy_loss
from agentgym_rl.learner.losses import cispo_policy_loss, clipped_policy_loss, gspo_policy_loss
from tests.integration.reinforce_loss import reinforce_loss


def test_the_shipped_surrogates_are_registered_as_their_pure_functions():
    g = torch.Generator().manual_seed(0)
    logprobs, old, advantages = (torch.randn(3, 5, generator=g) for _ in range(3))
    mask = (torch.rand(3, 5, generator=g) > 0.3).float()
    config = PolicyGradientParams(clip_low=0.2, clip_high=0.28, dual_clip=3.0)
    expected = {
        "ppo": clipped_policy_loss(logprobs, old, advantages, 0.2, 0.28, 3.0),
        "gspo": gspo_policy_loss(logprobs, old, advantages, mask, 0.2, 0.28),
        "cispo": cispo_policy_loss(logprobs, old, advantages, 0.2, 0.28),
    }
    for name, (loss, clipped) in expected.items():
        got_loss, got_clipped = resolve_policy_loss(name)(
            logprobs=logprobs, old_logprobs=old, advantages=advantages, mask=mask, config=config
        )
        assert torch.equal(got_loss, loss) and torch.equal(got_clipped, clipped), name


def test_an_unknown_policy_loss_names_the_key_and_lists_the_registered_ones():
    assert {"ppo", "gspo", "cispo", "reinforce"} <= set(policy_loss_names())
    with pytest.raises(
        AlgorithmConfigError, match=r"algorithm.policy_loss: .*unknown policy loss 'nope'; registered: "
    ):
        build_algorithm("grpo", {"policy_loss": "nope"})


def test_a_loss_is_selectable_by_its_path_and_a_bad_path_is_refused():
    path = "tests.integration.reinforce_loss:reinforce_loss"
    assert resolve_policy_loss(path) is reinforce_loss
    assert build_algorithm("rloo", {"policy_loss": path}).config.policy_loss == path
    with pytest.raises(AlgorithmConfigError, match="cannot be imported"):
        resolve_policy_loss("no_such_module:loss")
    with pytest.raises(AlgorithmConfigError, match="is not a function"):
        resolve_policy_loss("agentgym_rl.learner.algorithms.base:INPUT_IDS")  # a column name

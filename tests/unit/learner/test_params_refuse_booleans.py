"""An algorithm's number hyperparameters refuse booleans, like every config section (``configs.strict``)."""

import pytest

from agentgym_rl.learner.algorithms import build_algorithm
from agentgym_rl.learner.algorithms.base import AlgorithmConfigError


def test_an_algorithm_hyperparameter_refuses_a_boolean():
    with pytest.raises(AlgorithmConfigError, match="clip_eps"):
        build_algorithm("grpo", {"clip_eps": True})
    assert build_algorithm("grpo", {"skip_uniform_groups": False}).skips_uninformative_groups is False

"""The documented user algorithm (docs/examples/custom_algorithm.py), loaded as a user would: by `module:Class`."""

import sys
from pathlib import Path

import pytest

from agentgym_rl.configs import Config
from agentgym_rl.learner.actor import LearnerActor
from agentgym_rl.learner.algorithms import AlgorithmConfigError, build_algorithm
from tests.unit.learner.helpers import batch_of

EXAMPLES = Path(__file__).resolve().parents[3] / "docs" / "examples"


@pytest.fixture
def user_module(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    yield "custom_algorithm:BestOfGroup"
    sys.modules.pop("custom_algorithm", None)


def test_example_algorithm_refuses_a_misspelt_key_by_name(user_module):
    # Its advantages are checked by the example itself (tests/e2e/test_examples.py runs it).
    with pytest.raises(AlgorithmConfigError, match="algorithm.margn"):
        build_algorithm(user_module, {"margn": 1})


def test_example_algorithm_trains_in_the_learner(user_module):
    config = Config.model_validate(
        {"model": {"name": "tiny-random"}, "algorithm": {"name": user_module, "margin": 0.0}}
    )
    learner = LearnerActor(model=config.model, learner=config.learner, algorithm=config.algorithm, seed=0)
    metrics = learner.update_batch(batch_of())
    assert learner.version == 1 and metrics["learner/advantage_abs_mean"] > 0

"""The README's user-defined algorithm, run as a user would: from its own module, by `module:Class`."""

import re
import sys
from pathlib import Path

import pytest
import torch

from agentgym_rl.configs import Config
from agentgym_rl.learner.actor import LearnerActor
from agentgym_rl.learner.algorithms import AlgorithmConfigError, build_algorithm
from tests.unit.learner.helpers import batch_of

README = Path(__file__).resolve().parents[3] / "README.md"


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    text = README.read_text()
    code = re.search(r"<!-- user-algorithm -->\n```python\n(.*?)```", text, re.DOTALL).group(1)
    (tmp_path / "my_algos.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_algos:BestOfGroup"
    sys.modules.pop("my_algos", None)


def test_readme_algorithm_gives_advantage_to_the_best_of_each_group(user_module):
    algo = build_algorithm(user_module, {"margin": 0.1, "kl_coef": 0.0})
    batch = {
        "rewards": torch.tensor([0.2, 0.9, 0.5, 0.5, 0.55]),
        "groups": torch.tensor([0, 0, 0, 1, 1]),
        "truncated": torch.zeros(5, dtype=torch.bool),
        "loss_mask": torch.ones(5, 3),
        "token_rewards": torch.zeros(5, 3),
    }
    adv = algo.compute_advantages(batch)
    assert adv[:, 0].tolist() == [0.0, 1.0, 0.0, 0.0, 0.0]  # group 1's best beats its worst by < margin
    with pytest.raises(AlgorithmConfigError, match="algorithm.margn"):
        build_algorithm(user_module, {"margn": 1})


def test_readme_algorithm_trains_in_the_learner(user_module):
    config = Config.model_validate(
        {"model": {"name": "tiny-random"}, "algorithm": {"name": user_module, "margin": 0.0}}
    )
    learner = LearnerActor(model=config.model, learner=config.learner, algorithm=config.algorithm, seed=0)
    metrics = learner.update_batch(batch_of())
    assert learner.version == 1 and metrics["learner/advantage_abs_mean"] > 0

import pytest

from agentgym_rl.actors.curriculum import horizon_at
from agentgym_rl.configs.schema import CurriculumConfig


@pytest.mark.parametrize(
    ("iteration", "expected"),
    [(0, 6), (9, 6), (10, 13), (19, 13), (20, 20), (21, 20), (500, 20)],
)
def test_stepwise_advances_every_k_iterations_and_stays_on_the_last(iteration, expected):
    config = CurriculumConfig(schedule="stepwise", horizons=[6, 13, 20], advance_every=10)
    assert horizon_at(config, iteration) == expected


def test_fixed_schedule_ignores_the_iteration():
    config = CurriculumConfig(schedule="fixed", horizon=15)
    assert {horizon_at(config, i) for i in range(50)} == {15}

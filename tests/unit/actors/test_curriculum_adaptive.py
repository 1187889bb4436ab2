"""Curriculum schedules: stepwise boundaries and resume, and the adaptive schedule on scripted metrics."""

import asyncio
import itertools

import pytest
from pydantic import ValidationError

from agentgym_rl.actors.curriculum import CurriculumActor, adaptive_advance, horizon_at
from agentgym_rl.configs.schema import CurriculumConfig

STEPWISE = CurriculumConfig(schedule="stepwise", horizons=[6, 13, 20], advance_every=100)


def metrics(success: float, truncated: float = 0.0) -> dict:
    return {"success_rate": success, "rollout/truncated_rate": truncated, "iteration": 0}


def play(actor: CurriculumActor, stream: list[dict], start: int = 0) -> list[int]:
    """Drive ``actor`` as the trainer does; returns the horizon used by each iteration of ``stream``."""

    async def drive() -> list[int]:
        used = []
        for offset, record in enumerate(stream):
            used.append((await actor.start_iteration(start + offset))["horizon"])
            await actor.report(start + offset, record)
        return used

    return asyncio.run(drive())


@pytest.mark.parametrize(("iteration", "expected"), [(99, 6), (100, 13), (101, 13), (199, 13), (200, 20), (201, 20)])
def test_stepwise_boundaries_at_k_minus_one_k_and_k_plus_one(iteration, expected):
    assert horizon_at(STEPWISE, iteration) == expected


@pytest.mark.parametrize("iterations_done", [99, 100, 101, 200])
def test_stepwise_actor_resumed_from_a_checkpoint_matches_an_uninterrupted_one(iterations_done):
    uninterrupted = CurriculumActor(STEPWISE)
    through = play(uninterrupted, [metrics(0.0)] * (iterations_done + 3))

    first = CurriculumActor(STEPWISE)
    play(first, [metrics(0.0)] * iterations_done)
    saved = asyncio.run(first.state())
    resumed = CurriculumActor(STEPWISE)
    assert asyncio.run(resumed.load_state(saved)) == horizon_at(STEPWISE, iterations_done - 1)
    after = play(resumed, [metrics(0.0)] * 3, start=iterations_done)

    assert after == through[iterations_done:]
    assert after[0] == horizon_at(STEPWISE, iterations_done)
    assert asyncio.run(resumed.state())["changes"] == asyncio.run(uninterrupted.state())["changes"]


ADAPTIVE = CurriculumConfig(
    schedule="adaptive", horizons=[3, 6, 9], window=3, success_threshold=0.6, min_iterations_per_stage=4
)


def test_adaptive_advances_once_the_rolling_success_rate_passes_the_threshold():
    # iterations 0-3 at horizon 3; the window 1..3 averages 0.6 at iteration 3 (the minimum stage length)
    stream = [metrics(0.0), metrics(0.6), metrics(0.5), metrics(0.7)] + [metrics(0.1)] * 6
    actor = CurriculumActor(ADAPTIVE)
    used = play(actor, stream)
    assert used == [3, 3, 3, 3, 6, 6, 6, 6, 6, 6]
    assert asyncio.run(actor.state())["changes"] == [{"iteration": 4, "from": 3, "to": 6}]


def test_adaptive_waits_for_the_minimum_stage_length_even_when_successful():
    actor = CurriculumActor(ADAPTIVE)
    used = play(actor, [metrics(1.0)] * 13)
    # one advance per 4 iterations at most, and the last horizon is kept
    assert used == [3, 3, 3, 3, 6, 6, 6, 6, 9, 9, 9, 9, 9]


def test_adaptive_window_only_counts_iterations_at_the_current_horizon():
    actor = CurriculumActor(ADAPTIVE)
    # successes at horizon 3 do not carry over: at horizon 6 (iterations 4-7) every episode fails,
    # so the window reaches (0 + 0.9 + 0.9) / 3 = 0.6 only at iteration 9
    used = play(actor, [metrics(1.0)] * 4 + [metrics(0.0)] * 4 + [metrics(0.9)] * 4)
    assert used == [3] * 4 + [6] * 6 + [9] * 2
    assert asyncio.run(actor.state())["stage"] == 2


def test_adaptive_never_shrinks_when_success_collapses():
    actor = CurriculumActor(ADAPTIVE)
    used = play(actor, [metrics(1.0)] * 4 + [metrics(0.0)] * 20)
    assert used == [3] * 4 + [6] * 20
    assert all(b >= a for a, b in itertools.pairwise(used))


def test_adaptive_truncation_trigger_advances_a_binding_horizon():
    config = ADAPTIVE.model_copy(update={"truncation_threshold": 0.8})
    actor = CurriculumActor(config)
    used = play(actor, [metrics(0.0, truncated=0.9)] * 6)
    assert used == [3, 3, 3, 3, 6, 6]
    # without the trigger the same stream stays put
    assert play(CurriculumActor(ADAPTIVE), [metrics(0.0, truncated=0.9)] * 6) == [3] * 6


def test_adaptive_decision_function_on_its_own():
    assert adaptive_advance(ADAPTIVE, [metrics(1.0)] * 3) is None  # shorter than min_iterations_per_stage
    assert adaptive_advance(ADAPTIVE, [metrics(1.0)] * 4) == "success"
    assert adaptive_advance(ADAPTIVE, [metrics(1.0)] + [metrics(0.5)] * 3) is None  # window is the last 3


def test_adaptive_state_round_trips_mid_stage():
    stream = [metrics(1.0)] * 4 + [metrics(0.9)] * 2
    first = CurriculumActor(ADAPTIVE)
    play(first, stream)
    resumed = CurriculumActor(ADAPTIVE)
    asyncio.run(resumed.load_state(asyncio.run(first.state())))
    # two more good iterations complete the 4-iteration stage at horizon 6, then horizon 9 starts
    assert play(resumed, [metrics(0.9)] * 3, start=6) == [6, 6, 9]


def test_adaptive_report_names_missing_metrics():
    actor = CurriculumActor(ADAPTIVE)
    with pytest.raises(KeyError, match="rollout/truncated_rate"):
        asyncio.run(actor.report(0, {"success_rate": 1.0}))


def test_adaptive_has_no_pure_horizon_and_validates_its_horizons():
    with pytest.raises(ValueError, match="adaptive"):
        horizon_at(ADAPTIVE, 0)
    with pytest.raises(ValidationError, match="non-decreasing"):
        CurriculumConfig(schedule="adaptive", horizons=[9, 3])

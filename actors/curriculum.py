"""Interaction-horizon curriculum (ScalingInter-RL) and the actor that owns a run's horizon.

The horizon reaches the samplers on each episode request (``EpisodeRequest.horizon``), never pushed: the driver
asks the actor at each iteration start and puts the answer on the requests it launches."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import structlog

from agentgym_rl.configs.schema import CurriculumConfig
from agentgym_rl.envs.actor import hide_unreserved_gpus

log = structlog.get_logger()

SUCCESS_KEY = "success_rate"
TRUNCATION_KEY = "rollout/truncated_rate"


def horizon_at(config: CurriculumConfig, iteration: int) -> int:
    """The horizon for 0-based ``iteration`` under the ``fixed`` and ``stepwise`` schedules.

    ``stepwise`` spends ``advance_every`` iterations on each entry of ``horizons`` and stays on the
    last one: iterations 0..K-1 use ``horizons[0]``, K..2K-1 use ``horizons[1]``, and so on. It is a
    pure function of the iteration, so a resumed run lands on the same stage (no off-by-one).

    Raises:
        ValueError: for the ``adaptive`` schedule, whose horizon depends on reported metrics
            (``CurriculumActor`` tracks it).
    """
    if config.schedule == "fixed":
        return config.horizon
    if config.schedule == "adaptive":
        raise ValueError("the adaptive schedule has no horizon per iteration; it follows reported metrics")
    stage = min(iteration // config.advance_every, len(config.horizons) - 1)
    return config.horizons[stage]


def largest_horizon(config: CurriculumConfig) -> int:
    """The horizon the schedule ends at: ``horizon`` for ``fixed``, the last of ``horizons`` otherwise."""
    return config.horizon if config.schedule == "fixed" else max(config.horizons)


def adaptive_advance(config: CurriculumConfig, stage_history: Sequence[Mapping[str, float]]) -> str | None:
    """Why the ``adaptive`` schedule leaves its current stage now, or None to stay.

    Args:
        config: the curriculum section.
        stage_history: the metrics of every iteration played at the current horizon, oldest first
            (at least their ``success_rate`` and ``rollout/truncated_rate``).

    Returns:
        ``"success"`` when the mean ``success_rate`` of the last ``window`` iterations reaches
        ``success_threshold``, ``"truncation"`` when their mean truncation rate reaches
        ``truncation_threshold`` (the horizon binds), else None. Nothing advances before the stage
        has lasted ``min_iterations_per_stage`` iterations and filled a whole window.
    """
    if len(stage_history) < max(config.window, config.min_iterations_per_stage):
        return None
    recent = stage_history[-config.window :]
    if sum(m[SUCCESS_KEY] for m in recent) / len(recent) >= config.success_threshold:
        return "success"
    threshold = config.truncation_threshold
    if threshold is not None and sum(m[TRUNCATION_KEY] for m in recent) / len(recent) >= threshold:
        return "truncation"
    return None


class CurriculumActor:
    """Owns the current horizon: its schedule, its adaptive stage and the changes so far.

    Args:
        config: the curriculum section.
    """

    def __init__(self, config: CurriculumConfig) -> None:
        hide_unreserved_gpus()
        self.config = config
        self.changes: list[dict] = []
        # adaptive schedule: index into ``horizons`` and the metrics reported at that horizon
        self.stage = 0
        self.stage_history: list[dict[str, float]] = []
        self.horizon = self._target(0)

    def _target(self, iteration: int) -> int:
        if self.config.schedule == "adaptive":
            return self.config.horizons[self.stage]
        return horizon_at(self.config, iteration)

    async def start_iteration(self, iteration: int) -> dict:
        """Move to ``iteration``: the horizon of the episodes launched from now on.

        Returns:
            ``{"horizon": h, "changed": bool}``.
        """
        horizon = self._target(iteration)
        changed = horizon != self.horizon
        if changed:
            log.info("horizon changed", iteration=iteration, old=self.horizon, new=horizon)
            self.changes.append({"iteration": iteration, "from": self.horizon, "to": horizon})
            self.horizon = horizon
        return {"horizon": self.horizon, "changed": changed}

    async def report(self, iteration: int, metrics: Mapping[str, float]) -> dict:
        """Take the metrics of finished ``iteration``; the adaptive schedule may advance a stage.

        An advance takes effect from the next ``start_iteration`` (the horizon never shrinks: the
        stage index only grows and ``horizons`` is non-decreasing).

        Returns:
            ``{"stage": index into horizons, "advanced": reason or None}``.

        Raises:
            KeyError: ``metrics`` lacks ``success_rate`` or ``rollout/truncated_rate``.
        """
        if self.config.schedule != "adaptive":
            return {"stage": None, "advanced": None}
        missing = [key for key in (SUCCESS_KEY, TRUNCATION_KEY) if key not in metrics]
        if missing:
            raise KeyError(f"curriculum.report needs metrics {missing} for iteration {iteration}")
        self.stage_history.append({key: float(metrics[key]) for key in (SUCCESS_KEY, TRUNCATION_KEY)})
        reason = None
        if self.stage + 1 < len(self.config.horizons):
            reason = adaptive_advance(self.config, self.stage_history)
        if reason is not None:
            self.stage += 1
            log.info(
                "curriculum advances",
                iteration=iteration,
                reason=reason,
                next_horizon=self.config.horizons[self.stage],
                window=self.stage_history[-self.config.window :],
            )
            self.stage_history = []
        elif len(self.stage_history) > max(self.config.window, self.config.min_iterations_per_stage):
            self.stage_history = self.stage_history[-max(self.config.window, self.config.min_iterations_per_stage) :]
        return {"stage": self.stage, "advanced": reason}

    async def state(self) -> dict:
        """What a checkpoint stores to restore this actor."""
        return {
            "horizon": self.horizon,
            "changes": list(self.changes),
            "stage": self.stage,
            "stage_history": list(self.stage_history),
        }

    async def load_state(self, state: dict) -> int:
        """Restore ``state``; returns its horizon."""
        self.horizon = state["horizon"]
        self.changes = list(state["changes"])
        # Checkpoints written before the adaptive schedule existed lack these two keys.
        self.stage = state.get("stage", 0)
        self.stage_history = list(state.get("stage_history", []))
        return self.horizon

"""Interaction-horizon curriculum (ScalingInter-RL) and the actor that pushes it to samplers."""

from __future__ import annotations

import asyncio

import ray
import structlog

from configs.schema import CurriculumConfig

log = structlog.get_logger()


def horizon_at(config: CurriculumConfig, iteration: int) -> int:
    """The horizon for 0-based ``iteration``.

    ``stepwise`` spends ``advance_every`` iterations on each entry of ``horizons`` and stays on the
    last one: iterations 0..K-1 use ``horizons[0]``, K..2K-1 use ``horizons[1]``, and so on. It is a
    pure function of the iteration, so a resumed run lands on the same stage (no off-by-one).
    """
    if config.schedule == "fixed":
        return config.horizon
    stage = min(iteration // config.advance_every, len(config.horizons) - 1)
    return config.horizons[stage]


class CurriculumActor:
    """Owns the current horizon and pushes every change to all registered samplers.

    Args:
        config: the curriculum section.
    """

    def __init__(self, config: CurriculumConfig) -> None:
        self.config = config
        self.samplers: list[ray.actor.ActorHandle] = []
        self.horizon = horizon_at(config, 0)
        self.changes: list[dict] = []

    async def register(self, samplers: list[ray.actor.ActorHandle]) -> int:
        """Add samplers and push the current horizon to them; returns the horizon."""
        self.samplers.extend(samplers)
        await self._push(samplers, self.horizon)
        return self.horizon

    async def start_iteration(self, iteration: int) -> dict:
        """Move to ``iteration``; if its horizon differs, push it to every sampler before returning.

        Returns:
            ``{"horizon": h, "changed": bool}``.
        """
        horizon = horizon_at(self.config, iteration)
        changed = horizon != self.horizon
        if changed:
            log.info("horizon changed", iteration=iteration, old=self.horizon, new=horizon)
            self.changes.append({"iteration": iteration, "from": self.horizon, "to": horizon})
            self.horizon = horizon
            await self._push(self.samplers, horizon)
        return {"horizon": self.horizon, "changed": changed}

    async def state(self) -> dict:
        """What a checkpoint stores to restore this actor."""
        return {"horizon": self.horizon, "changes": list(self.changes)}

    async def load_state(self, state: dict) -> int:
        """Restore ``state`` and push its horizon to every registered sampler."""
        self.horizon = state["horizon"]
        self.changes = list(state["changes"])
        await self._push(self.samplers, self.horizon)
        return self.horizon

    @staticmethod
    async def _push(samplers: list[ray.actor.ActorHandle], horizon: int) -> None:
        await asyncio.gather(*(s.set_horizon.remote(horizon) for s in samplers))

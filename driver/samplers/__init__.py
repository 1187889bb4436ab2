"""The samplers of a run, owned by one ``SamplerGroup``: their pools, the episodes they play and the weights
they receive."""

from agentgym_rl.driver.samplers.group import SamplerFailed, SamplerGroup
from agentgym_rl.driver.samplers.pool import PoolError
from agentgym_rl.driver.samplers.transports import WeightSource

__all__ = ["PoolError", "SamplerFailed", "SamplerGroup", "WeightSource"]

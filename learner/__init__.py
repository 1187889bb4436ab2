"""The learner: algorithms (plug-in API), advantage estimators, losses, batching and the learner actor."""

from learner.algorithms import (
    GRPO,
    PPO,
    RLOO,
    SFT,
    Algorithm,
    AlgorithmParams,
    PolicyGradient,
    PolicyGradientParams,
    ReinforcePP,
    algorithm_names,
    build_algorithm,
    register_algorithm,
    resolve_algorithm,
)

__all__ = [
    "GRPO",
    "PPO",
    "RLOO",
    "SFT",
    "Algorithm",
    "AlgorithmParams",
    "PolicyGradient",
    "PolicyGradientParams",
    "ReinforcePP",
    "algorithm_names",
    "build_algorithm",
    "register_algorithm",
    "resolve_algorithm",
]

"""The learner: algorithms (plug-in API), advantage estimators, losses, batching and the learner actor."""

from agentgym_rl.learner.algorithms import (
    CISPO,
    GRPO,
    GSPO,
    PPO,
    RLOO,
    SFT,
    Algorithm,
    AlgorithmParams,
    GiGPO,
    PolicyGradient,
    PolicyGradientParams,
    ReinforcePP,
    algorithm_names,
    build_algorithm,
    register_algorithm,
    resolve_algorithm,
)

__all__ = [
    "CISPO",
    "GRPO",
    "GSPO",
    "PPO",
    "RLOO",
    "SFT",
    "Algorithm",
    "AlgorithmParams",
    "GiGPO",
    "PolicyGradient",
    "PolicyGradientParams",
    "ReinforcePP",
    "algorithm_names",
    "build_algorithm",
    "register_algorithm",
    "resolve_algorithm",
]

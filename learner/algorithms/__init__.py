"""Algorithms, registered by name; importing this package registers the shipped ones."""

from learner.algorithms.base import (
    Algorithm,
    AlgorithmConfigError,
    AlgorithmParams,
    algorithm_names,
    build_algorithm,
    register_algorithm,
    resolve_algorithm,
)
from learner.algorithms.dpo import DPO, build_pairs
from learner.algorithms.grpo import GRPO
from learner.algorithms.policy_gradient import (
    GroupRelative,
    GroupRelativeParams,
    PolicyGradient,
    PolicyGradientParams,
)
from learner.algorithms.ppo import PPO
from learner.algorithms.reinforce_pp import ReinforcePP
from learner.algorithms.rloo import RLOO
from learner.algorithms.sft import SFT

__all__ = [
    "DPO",
    "GRPO",
    "PPO",
    "RLOO",
    "SFT",
    "Algorithm",
    "AlgorithmConfigError",
    "AlgorithmParams",
    "GroupRelative",
    "GroupRelativeParams",
    "PolicyGradient",
    "PolicyGradientParams",
    "ReinforcePP",
    "algorithm_names",
    "build_algorithm",
    "build_pairs",
    "register_algorithm",
    "resolve_algorithm",
]

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
from learner.algorithms.cispo import CISPO
from learner.algorithms.dpo import DPO, build_pairs
from learner.algorithms.gigpo import GiGPO
from learner.algorithms.grpo import GRPO
from learner.algorithms.gspo import GSPO
from learner.algorithms.policy_gradient import (
    GroupRelative,
    GroupRelativeParams,
    PolicyGradient,
    PolicyGradientParams,
    TurnCreditParams,
)
from learner.algorithms.ppo import PPO
from learner.algorithms.reinforce_pp import ReinforcePP
from learner.algorithms.rloo import RLOO
from learner.algorithms.sft import SFT

__all__ = [
    "CISPO",
    "DPO",
    "GRPO",
    "GSPO",
    "PPO",
    "RLOO",
    "SFT",
    "Algorithm",
    "AlgorithmConfigError",
    "AlgorithmParams",
    "GiGPO",
    "GroupRelative",
    "GroupRelativeParams",
    "PolicyGradient",
    "PolicyGradientParams",
    "ReinforcePP",
    "TurnCreditParams",
    "algorithm_names",
    "build_algorithm",
    "build_pairs",
    "register_algorithm",
    "resolve_algorithm",
]

"""Algorithms, registered by name; importing this package registers the shipped ones."""

from agentgym_rl.learner.algorithms.base import (
    Algorithm,
    AlgorithmConfigError,
    AlgorithmParams,
    algorithm_names,
    build_algorithm,
    register_algorithm,
    resolve_algorithm,
)
from agentgym_rl.learner.algorithms.cispo import CISPO
from agentgym_rl.learner.algorithms.dpo import DPO, build_pairs
from agentgym_rl.learner.algorithms.gigpo import GiGPO
from agentgym_rl.learner.algorithms.grpo import GRPO
from agentgym_rl.learner.algorithms.gspo import GSPO
from agentgym_rl.learner.algorithms.policy_gradient import (
    GroupRelative,
    GroupRelativeParams,
    PolicyGradient,
    PolicyGradientParams,
    PolicyLoss,
    TurnCreditParams,
    policy_loss_names,
    register_policy_loss,
    resolve_policy_loss,
)
from agentgym_rl.learner.algorithms.ppo import PPO
from agentgym_rl.learner.algorithms.reinforce_pp import ReinforcePP
from agentgym_rl.learner.algorithms.rloo import RLOO
from agentgym_rl.learner.algorithms.sft import SFT

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
    "PolicyLoss",
    "ReinforcePP",
    "TurnCreditParams",
    "algorithm_names",
    "build_algorithm",
    "build_pairs",
    "policy_loss_names",
    "register_algorithm",
    "register_policy_loss",
    "resolve_algorithm",
    "resolve_policy_loss",
]

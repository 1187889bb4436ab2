"""Text environments, their registry and the Ray actor that hosts one instance."""

from agentgym_rl.envs.base import EnvError, InvalidAction, Observation, StepResult, TextEnv
from agentgym_rl.envs.registry import env_class, make, names, register

__all__ = [
    "EnvError",
    "InvalidAction",
    "Observation",
    "StepResult",
    "TextEnv",
    "env_class",
    "make",
    "names",
    "register",
]

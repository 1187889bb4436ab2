"""Text environments, their registry and the Ray actor that hosts one instance."""

from envs.base import EnvError, InvalidAction, Observation, StepResult, TextEnv
from envs.registry import env_class, make, names, register

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

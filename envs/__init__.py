"""Text environments, their registry and the Ray actor that hosts one instance."""

from agentgym_rl.envs.base import EnvError, EnvUnavailable, InvalidAction, Observation, StepResult, TextEnv
from agentgym_rl.envs.registry import env_class, make, names, register
from agentgym_rl.envs.tools import Function, ToolCall

__all__ = [
    "EnvError",
    "EnvUnavailable",
    "Function",
    "InvalidAction",
    "Observation",
    "StepResult",
    "TextEnv",
    "ToolCall",
    "env_class",
    "make",
    "names",
    "register",
]

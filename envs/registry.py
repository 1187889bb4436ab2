"""Name -> environment class registry. Every environment is created through ``make``."""

from __future__ import annotations

from typing import Any

from agentgym_rl.configs.targets import import_target
from agentgym_rl.envs.base import EnvError, TextEnv

_REGISTRY: dict[str, str] = {}


def register(name: str, target: str) -> None:
    """Register ``target`` (``"package.module:Class"``) under ``name``; the import happens on first use."""
    if ":" not in target:
        raise ValueError(f"env target {target!r} must look like 'package.module:Class'")
    _REGISTRY[name] = target


def names() -> list[str]:
    """Registered environment names, sorted."""
    return sorted(_REGISTRY)


def env_class(name: str) -> type[TextEnv]:
    """The class registered as ``name`` (or named by ``"package.module:Class"`` directly, so a process
    such as an env actor finds an env that was registered elsewhere); raises EnvError otherwise."""
    if name not in _REGISTRY and ":" not in name:
        raise EnvError(f"unknown env {name!r}; registered envs: {', '.join(names())}")
    target = _REGISTRY.get(name, name)
    try:
        found = import_target(target)
    except ImportError as exc:
        raise EnvError(f"env {name!r} names {target!r}, which cannot be loaded: {exc}") from exc
    if not (isinstance(found, type) and issubclass(found, TextEnv)):
        raise EnvError(f"env {name!r} names {target!r}, which is not a TextEnv subclass")
    return found


def make(name: str, options: dict[str, Any] | None = None) -> TextEnv:
    """Create the environment ``name`` with its ``options`` (validated by the env's ``Options`` model)."""
    cls = env_class(name)
    return cls(**(options or {}))


register("babyai", "agentgym_rl.envs.babyai:BabyAIEnv")
register("agentgym-remote", "agentgym_rl.envs.http.client:AgentGymClient")
register("textcraft", "agentgym_rl.envs.textcraft:TextCraftEnv")
register("sciworld", "agentgym_rl.envs.sciworld:SciWorldEnv")
register("search", "agentgym_rl.envs.search.env:SearchEnv")
register("web", "agentgym_rl.envs.web.env:WebEnv")
register("webarena-remote", "agentgym_rl.envs.web.remote:WebArenaClient")
register("openenv", "agentgym_rl.envs.openenv.client:OpenEnvClient")
register("mcp", "agentgym_rl.envs.mcp.env:McpEnv")
register("target-word", "agentgym_rl.envs.target_word:TargetWordEnv")

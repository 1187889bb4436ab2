"""Configuration: the pydantic schema, the YAML presets beside this file, and the loader.

The names below load on first use (PEP 562): an env actor imports ``configs.errors`` and ``configs.targets`` only,
and importing the package must not build every section's pydantic model, nor load YAML and structlog, in each of
its hundreds of processes (about 0.5 s of CPU and several MB apiece).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agentgym_rl.configs.loader import ConfigError, dump_config, load_config
    from agentgym_rl.configs.schema import Config

_WHERE = {
    "Config": "agentgym_rl.configs.schema",
    "ConfigError": "agentgym_rl.configs.loader",
    "dump_config": "agentgym_rl.configs.loader",
    "load_config": "agentgym_rl.configs.loader",
}

__all__ = ["Config", "ConfigError", "dump_config", "load_config"]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value

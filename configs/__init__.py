"""Configuration: the pydantic schema, the YAML presets beside this file, and the loader."""

from agentgym_rl.configs.loader import ConfigError, dump_config, load_config
from agentgym_rl.configs.schema import Config

__all__ = ["Config", "ConfigError", "dump_config", "load_config"]

"""Configuration: the pydantic schema, the YAML presets beside this file, and the loader."""

from configs.loader import ConfigError, dump_config, load_config
from configs.schema import Config

__all__ = ["Config", "ConfigError", "dump_config", "load_config"]

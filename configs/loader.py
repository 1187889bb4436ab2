"""Load a YAML config, apply ``--set a.b=c`` overrides, validate, and explain what is wrong.

Relative input paths (see ``resolve_input_paths``) are made absolute as they are read, so a config means the
same wherever a command runs, and its dump in a run directory means the same from anywhere: a config file's
against the project root when the file lies in the project tree (the presets, the committed stage configs, a run
directory under the repository), else against the file's own directory; an override's against the working
directory, where its user typed it. Output paths (``run.dir``, ``logging.wandb.dir``) stay relative to the
working directory.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import structlog
import yaml
from pydantic import ValidationError

from agentgym_rl.configs.errors import AgentGymError
from agentgym_rl.configs.schema import AlgorithmConfig, Config

log = structlog.get_logger()

PRESET_DIR = Path(__file__).resolve().parent
DEFAULT_PRESET = "quickstart.yaml"
# The project tree: its presets and committed stage configs name the repository's files from here.
PROJECT_ROOT = PRESET_DIR.parent


class ConfigError(AgentGymError, ValueError):
    """A config that cannot be used; the message names the offending key and what to do."""


def resolve_path(path: str | Path | None) -> Path:
    """Return the config file for ``path``: an existing file, or the name of a preset in ``configs/``."""
    if path is None:
        return PRESET_DIR / DEFAULT_PRESET
    candidate = Path(path)
    if candidate.is_file():
        return candidate
    preset = PRESET_DIR / candidate.name
    if preset.is_file() and candidate.parent in (Path("."), Path("configs")):
        return preset
    presets = ", ".join(sorted(p.name for p in PRESET_DIR.glob("*.yaml")))
    raise ConfigError(f"config file {str(path)!r} not found; presets in configs/: {presets}")


def parse_override(item: str) -> tuple[list[str], Any]:
    """Split ``a.b=c`` into (["a", "b"], c) with c parsed as a YAML scalar (``1e-6``, ``true``, ``[5,10]``)."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {item!r} must look like section.key=value (e.g. trainer.iterations=2)")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {item!r}: value {raw!r} is not valid YAML ({exc})") from exc
    except RecursionError:
        raise ConfigError(f"override {key.strip()}=...: the value is nested too deeply to read") from None
    return key.strip().split("."), value


def apply_override(data: dict[str, Any], item: str) -> None:
    """Set the value of one ``a.b=c`` override inside the nested dict ``data``; an input path it gives (see
    ``resolve_input_paths``) is made absolute against the working directory, where the user typed it."""
    path, value = parse_override(item)
    value = typed_paths_resolved(path, value)
    node = data
    for i, part in enumerate(path[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {item!r}: {'.'.join(path[: i + 1])} is a value, not a section")
        node = child
    node[path[-1]] = value


def typed_paths_resolved(path: list[str], value: Any) -> Any:
    """``value``, the override of key ``path``, with the input paths it gives made absolute against the working
    directory; nested under its key first, so a whole section given at once (``model={adapter: ...}``) is seen
    the way a file's is."""
    nested = value
    for part in reversed(path):
        nested = {part: nested}
    resolve_input_paths(nested, Path.cwd())
    for part in path:
        nested = nested[part]
    return nested


def port_argument(text: str) -> int:
    """The ``type`` of a ``--port`` option: a TCP port, 1 to 65535 (the same range as ``serve.port``).

    Raises:
        argparse.ArgumentTypeError: ``text`` is not a whole number in that range (argparse names the option).
    """
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number: give 1 to 65535") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port: give 1 to 65535")
    return port


def format_validation_error(exc: ValidationError, source: str) -> str:
    lines = [f"invalid config ({source}):"]
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "<root>"
        if err["type"] == "extra_forbidden":
            lines.append(f"  {where}: unknown key (check the spelling; see docs/reference/configuration.md)")
        else:
            lines.append(f"  {where}: {err['msg'].removeprefix('Value error, ')} (got {err.get('input')!r})")
    return "\n".join(lines)


def one_line(message: str) -> str:
    """``message`` on one line: a config error's per-key lines follow its heading, joined by ``;``."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if len(lines) < 2:
        return message.strip()
    head, rest = lines[0], lines[1:]
    return f"{head} {'; '.join(rest)}" if head.endswith(":") else "; ".join(lines)


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    *,
    algorithm_keys: Callable[[str], Collection[str] | None] | None = None,
) -> Config:
    """Read ``path`` (default: the quickstart preset), apply ``overrides`` and validate.

    Args:
        path: a YAML file or a preset name.
        overrides: ``section.key=value`` items, applied in order.
        algorithm_keys: the hyperparameter keys an algorithm name accepts (None when the name is unknown).
            Given, an override that switches ``algorithm.name`` drops the file's algorithm keys the new
            algorithm does not accept (one warning names them), so ``--set algorithm.name=sft`` works on a
            preset written for GRPO; keys set by ``overrides`` are always kept and validated.

    Relative input paths come back absolute (see ``resolve_input_paths``): the file's against ``path_base``,
    the overrides' against the working directory.

    Raises:
        ConfigError: the file is missing or malformed, or a key or value is invalid; the
            message names every offending key.
    """
    file = resolve_path(path)
    data = read_yaml(file) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{file}: the top level must be a mapping of sections, got {type(data).__name__}")
    resolve_input_paths(data, path_base(file))
    section = data.get("algorithm")
    from_file = dict(section) if isinstance(section, dict) else {}
    for item in overrides or []:
        apply_override(data, item)
    if algorithm_keys is not None:
        set_here = {path[1] for path, _ in map(parse_override, overrides or []) if path[0] == "algorithm" and path[1:]}
        drop_unknown_algorithm_keys(data, from_file, set_here, algorithm_keys, source=str(file))
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, str(file))) from None


def path_base(file: Path) -> Path:
    """The folder the relative input paths of config ``file`` resolve against: the project root when the file
    lies in the project tree (symbolic links followed), else the file's own folder."""
    real = file.resolve()
    return PROJECT_ROOT if real.is_relative_to(PROJECT_ROOT) else real.parent


def absolute(path: str, base: Path) -> str:
    """``path`` with ``~`` expanded, joined to ``base`` when it is relative; an absolute one comes back as given."""
    expanded = os.path.expanduser(path)
    return expanded if os.path.isabs(expanded) else str(base / expanded)


def resolve_input_paths(data: dict[str, Any], base: Path) -> None:
    """Make the relative input paths of config ``data`` absolute against ``base``, in place: ``model.adapter``,
    each ``data.files`` entry (a file, run directory or glob pattern), and ``model.name`` when it names a path
    that exists under ``base`` (otherwise it is a built-in model's name, or a folder left to the working
    directory; the built-in names live in actors, which configs do not import). Values that are not non-empty
    strings are left for validation to report."""
    model = data.get("model")
    if isinstance(model, dict):
        adapter = model.get("adapter")
        if isinstance(adapter, str) and adapter:
            model["adapter"] = absolute(adapter, base)
        name = model.get("name")
        if isinstance(name, str) and name and Path(absolute(name, base)).exists():
            model["name"] = absolute(name, base)
    section = data.get("data")
    if isinstance(section, dict) and isinstance(section.get("files"), list):
        section["files"] = [absolute(f, base) if isinstance(f, str) and f else f for f in section["files"]]


def read_yaml(file: Path) -> Any:
    """The YAML document in ``file``.

    Raises:
        ConfigError: the file cannot be read, is not UTF-8 text (e.g. a binary file), is not valid YAML,
            or nests too deeply to read.
    """
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{file}: not a text file (byte {exc.start} is not UTF-8); give a YAML config file") from None
    except OSError as exc:
        raise ConfigError(
            f"{file}: cannot be read ({exc.strerror or exc}); check the path and its permissions"
        ) from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{file}: not valid YAML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{file}: nested too deeply to read; a config is a few levels of sections and keys") from None


def drop_unknown_algorithm_keys(
    data: dict[str, Any],
    from_file: dict[str, Any],
    set_here: set[str],
    algorithm_keys: Callable[[str], Collection[str] | None],
    *,
    source: str,
) -> list[str]:
    """When ``set_here`` switches ``algorithm.name`` away from the file's, remove from ``data["algorithm"]``
    the keys of ``from_file`` that the new algorithm does not accept and that ``set_here`` does not set;
    warns once naming them. Returns the removed keys (none when the new name is unknown: validation
    reports it then)."""
    default = AlgorithmConfig.model_fields["name"].default
    section = data.get("algorithm")
    if "name" not in set_here or not isinstance(section, dict):
        return []
    name = section.get("name", default)
    if name == from_file.get("name", default):
        return []
    accepted = algorithm_keys(str(name))
    if accepted is None:
        return []
    keep = set(AlgorithmConfig.model_fields) | set(accepted) | set_here
    dropped = [key for key in from_file if key not in keep and key in section]
    for key in dropped:
        del section[key]
    if dropped:
        log.warning(
            "dropped the config file's algorithm keys that the new algorithm does not know",
            algorithm=name,
            dropped=[f"algorithm.{key}" for key in dropped],
            file=source,
        )
    return dropped


def dump_config(config: Config) -> str:
    """The resolved config as YAML, loadable again by ``load_config``."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)

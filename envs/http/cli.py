"""Command-line flags and entry of the env server (``agentgym-rl env-server`` and ``python -m agentgym_rl.envs.http``):
AgentGym's protocol here; ``agentgym-rl env-server --protocol openenv`` serves ``envs.openenv.server`` through
``run_server`` too."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable

import pydantic

from agentgym_rl.configs.loader import ConfigError, format_validation_error, port_argument
from agentgym_rl.envs.base import EnvError
from agentgym_rl.envs.http.models import PROTOCOLS
from agentgym_rl.envs.http.server import serve


def add_server_arguments(parser: argparse.ArgumentParser, protocols: tuple[str, ...] = PROTOCOLS) -> None:
    """The env server's command-line flags (shared with ``agentgym-rl env-server``, which adds ``openenv`` to
    ``protocols``)."""
    parser.add_argument("env", metavar="ENV", help="registered env name (see `agentgym-rl envs`)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=port_argument, default=36001, help="port to listen on (default 36001)")
    parser.add_argument("--max-envs", type=int, default=64, help="live env instances allowed at once (default 64)")
    parser.add_argument("--options", default="{}", help="env options as JSON, e.g. '{\"max_steps\": 64}'")
    parser.add_argument(
        "--protocol",
        choices=protocols,
        default=None,
        help="response shapes of which AgentGym server (default: the one that mirrors ENV: textcraft, sciworld, "
        "searchqa for search, webarena for web, agentgym (BabyAI's) otherwise)"
        + (
            ", or openenv: OpenEnv's protocol (/reset, /step, /ws, /schema, the task API; the openenv extra)"
            if "openenv" in protocols
            else ""
        ),
    )
    parser.add_argument("--token", default=None, help="require this bearer token (default: $AGENTGYM_ENV_TOKEN)")


def parse_options(text: str) -> dict:
    """An env's ``--options`` JSON object.

    Raises:
        ValueError: the text is not JSON.
        TypeError: it is JSON but not an object.
    """
    try:
        options = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--options is not JSON ({exc}): {text}") from exc
    if not isinstance(options, dict):
        raise TypeError(f"--options must be a JSON object, got {text}")
    return options


def run_server(args: argparse.Namespace, serve_env: Callable[..., None] | None = None) -> int:
    """Serve ``args.env`` until interrupted: over AgentGym's protocol, or with ``serve_env`` (called with the env
    name and the keywords ``host``, ``port``, ``max_envs``, ``options`` and ``token``) over another.

    Raises:
        ConfigError: a bad env name or bad options (the message names them).
    """
    token = args.token or os.environ.get("AGENTGYM_ENV_TOKEN") or None
    try:
        options = parse_options(args.options)
        if serve_env is not None:
            serve_env(args.env, host=args.host, port=args.port, max_envs=args.max_envs, options=options, token=token)
            return 0
        serve(
            args.env,
            host=args.host,
            port=args.port,
            max_envs=args.max_envs,
            options=options,
            token=token,
            protocol=args.protocol,
        )
    except pydantic.ValidationError as exc:
        raise ConfigError(format_validation_error(exc, f"env-server {args.env}")) from None
    except (ValueError, TypeError, EnvError) as exc:
        raise ConfigError(str(exc)) from None
    return 0

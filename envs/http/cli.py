"""Command-line flags and entry of the env server (``agentgym-rl env-server`` and ``python -m agentgym_rl.envs.http``):
AgentGym's protocol, or OpenEnv's with ``--protocol openenv`` (``envs.openenv.server``)."""

from __future__ import annotations

import argparse
import json
import os

import pydantic

from agentgym_rl.configs.loader import ConfigError, format_validation_error, port_argument
from agentgym_rl.envs.base import EnvError
from agentgym_rl.envs.http.models import PROTOCOLS
from agentgym_rl.envs.http.server import serve


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """The env server's command-line flags (shared with ``agentgym-rl env-server``)."""
    parser.add_argument("env", metavar="ENV", help="registered env name (see `agentgym-rl envs`)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=port_argument, default=36001, help="port to listen on (default 36001)")
    parser.add_argument("--max-envs", type=int, default=64, help="live env instances allowed at once (default 64)")
    parser.add_argument("--options", default="{}", help="env options as JSON, e.g. '{\"max_steps\": 64}'")
    parser.add_argument(
        "--protocol",
        choices=(*PROTOCOLS, "openenv"),
        default=None,
        help="response shapes of which AgentGym server (default: the one that mirrors ENV: textcraft, sciworld, "
        "searchqa for search, webarena for web, agentgym (BabyAI's) otherwise), or openenv: OpenEnv's protocol "
        "(/reset, /step, /ws, /schema, the task API; needs the openenv extra)",
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


def run_server(args: argparse.Namespace) -> int:
    """Serve ``args.env`` until interrupted.

    Raises:
        ConfigError: a bad env name or bad options (the message names them).
    """
    token = args.token or os.environ.get("AGENTGYM_ENV_TOKEN") or None
    try:
        options = parse_options(args.options)
        if args.protocol == "openenv":
            from agentgym_rl.envs.openenv.server import serve_openenv  # the openenv extra, imported only here

            serve_openenv(
                args.env, host=args.host, port=args.port, max_envs=args.max_envs, options=options, token=token
            )
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

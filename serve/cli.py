"""Entry of ``agentgym-rl serve``: serve a checkpoint or model until Ctrl-C."""

from __future__ import annotations

import argparse
import time

import ray
from pydantic import ValidationError

from agentgym_rl.actors.cluster import SHUTDOWN_GRACE_S, deadline, init_ray, ray_address, stop_on_signals
from agentgym_rl.configs import Config
from agentgym_rl.configs.loader import ConfigError, apply_override, format_validation_error
from agentgym_rl.serve.app import ServeArgs, ServeError, start_server, stop_server

# The model settings `agentgym-rl serve` takes besides serve.*: how tool calls are written and rendered.
MODEL_KEYS = ("model.tool_format", "model.tool_template")


def serve_config(args: argparse.Namespace) -> Config:
    """The ``serve`` section from ``--host``, ``--port``, ``--api-key`` and then each ``--set serve.KEY=VALUE``,
    and the model's tool settings from ``--set model.tool_format=...`` / ``model.tool_template=...``.

    Raises:
        ConfigError: an override of another key, or a value the section refuses (named with its key).
    """
    data: dict = {"serve": {"host": args.host, "port": args.port, "api_key": args.api_key}}
    for item in args.set:
        if not item.startswith("serve.") and item.partition("=")[0] not in MODEL_KEYS:
            raise ConfigError(
                f"--set {item!r}: `agentgym-rl serve` takes serve.* keys (e.g. serve.max_batch_size=8) and "
                f"{', '.join(MODEL_KEYS)}"
            )
        apply_override(data, item)
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, "--set")) from exc


def run_serve(args: argparse.Namespace) -> int:
    """Serve ``args.checkpoint`` or ``args.model`` on ``args.host:args.port``; blocks until a signal stops it.

    Raises:
        ConfigError, ServeError: bad settings, a bad checkpoint, or too few free CPUs (the CLI prints them).
        Stopped: SIGINT or SIGTERM, once Serve and Ray are shut down.
    """
    config = serve_config(args)
    try:
        serve_args = ServeArgs(
            checkpoint=args.checkpoint,
            model=args.model,
            tool_format=config.model.tool_format,
            tool_template=config.model.tool_template,
            serve=config.serve,
        )
    except ValidationError as exc:
        raise ServeError("; ".join(err["msg"].removeprefix("Value error, ") for err in exc.errors())) from None
    ray_config = Config()
    stop_on_signals()
    init_ray(ray_config)
    try:
        start_server(serve_args)
        print(f"serving {serve_args.served_id} on http://{args.host}:{args.port}/v1 (Ctrl-C to stop)", flush=True)
        while True:
            time.sleep(3600)
    finally:
        # A cluster outlives this command, so the app and Serve come off it; a local instance ends with all
        # of its actors, Serve's included, and skipping Serve's graceful drain makes Ctrl-C quick under load.
        with deadline(SHUTDOWN_GRACE_S, "the shutdown of Serve and Ray", exit_code=130):
            if ray_address(ray_config):
                stop_server(serve_args.app_name)
            ray.shutdown()

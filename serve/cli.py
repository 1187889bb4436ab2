"""Entry of ``agentgym-rl serve``: serve a checkpoint or model until Ctrl-C."""

from __future__ import annotations

import argparse
import sys
import time

import ray

from actors.trainer import init_ray, ray_address
from configs import Config
from configs.schema import ServeConfig
from serve.app import ServeArgs, ServeError, start_server, stop_server


def run_serve(args: argparse.Namespace) -> int:
    """Serve ``args.checkpoint`` or ``args.model`` on ``args.host:args.port``; blocks until interrupted.

    Returns 2 (after saying why) for a bad checkpoint, bad settings or too few free CPUs.
    """
    try:
        config = ServeConfig(host=args.host, port=args.port, api_key=args.api_key)
        serve_args = ServeArgs(checkpoint=args.checkpoint, model=args.model, serve=config)
    except ValueError as exc:
        print(f"agentgym-rl: error: {exc}", file=sys.stderr)
        return 2
    config = Config()
    init_ray(config)
    try:
        start_server(serve_args)
        print(f"serving {serve_args.served_id} on http://{args.host}:{args.port}/v1 (Ctrl-C to stop)", flush=True)
        while True:
            time.sleep(3600)
    except ServeError as exc:
        print(f"agentgym-rl: error: {exc}", file=sys.stderr)
        return 2
    finally:
        # A cluster outlives this command, so the app and Serve come off it; a local instance ends with all
        # of its actors, Serve's included, and skipping Serve's graceful drain makes Ctrl-C quick under load.
        if ray_address(config):
            stop_server(serve_args.app_name)
        ray.shutdown()

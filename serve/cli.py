"""Entry of ``agentgym-rl serve``: serve a checkpoint or model until Ctrl-C."""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import ray
from agentgym_rl.actors.cluster import init_ray, ray_address
from agentgym_rl.configs import Config
from agentgym_rl.configs.loader import ConfigError, apply_override, format_validation_error
from agentgym_rl.configs.schema import ServeConfig
from agentgym_rl.serve.app import ServeArgs, ServeError, start_server, stop_server
from pydantic import ValidationError

# Ray's shutdown takes seconds; once, on a loaded 2-core machine, it did not return at all after Ctrl-C.
SHUTDOWN_GRACE_S = 60.0


@contextmanager
def deadline(seconds: float, what: str, exit_code: int) -> Iterator[None]:
    """Run the block; if it is still running after ``seconds``, say so on stderr with the stack of every
    thread and end the process with ``exit_code`` (the processes of a local Ray instance end with it)."""

    def give_up() -> None:
        print(
            f"agentgym-rl: {what} did not finish within {seconds:g} s; exiting. Threads:", file=sys.stderr, flush=True
        )
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        os._exit(exit_code)

    timer = threading.Timer(seconds, give_up)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def stop_on_signals() -> None:
    """Make Ctrl-C (SIGINT) and SIGTERM stop the command (as KeyboardInterrupt), also where SIGINT arrives
    ignored: a non-interactive shell starts background jobs so, and Python then keeps it ignored."""

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, stop)


def serve_config(args: argparse.Namespace) -> ServeConfig:
    """The ``serve`` section from ``--host``, ``--port``, ``--api-key`` and then each ``--set serve.KEY=VALUE``.

    Raises:
        ConfigError: an override outside ``serve.``, or a value the section refuses (named with its key).
    """
    data: dict = {"serve": {"host": args.host, "port": args.port, "api_key": args.api_key}}
    for item in args.set:
        if not item.startswith("serve."):
            raise ConfigError(f"--set {item!r}: `agentgym-rl serve` takes serve.* keys (e.g. serve.max_batch_size=8)")
        apply_override(data, item)
    try:
        return Config.model_validate(data).serve
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, "--set")) from exc


def run_serve(args: argparse.Namespace) -> int:
    """Serve ``args.checkpoint`` or ``args.model`` on ``args.host:args.port``; blocks until interrupted.

    Returns 2 (after saying why) for a bad checkpoint, bad settings or too few free CPUs.
    """
    try:
        serve_args = ServeArgs(checkpoint=args.checkpoint, model=args.model, serve=serve_config(args))
    except ValueError as exc:
        print(f"agentgym-rl: error: {exc}", file=sys.stderr)
        return 2
    ray_config = Config()
    init_ray(ray_config)
    stop_on_signals()
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
        with deadline(SHUTDOWN_GRACE_S, "the shutdown of Serve and Ray", exit_code=130):
            if ray_address(ray_config):
                stop_server(serve_args.app_name)
            ray.shutdown()

"""The ``agentgym-rl`` command line."""

from __future__ import annotations

import argparse
import os
import sys

# The entry point sets Ray's loopback switch before anything imports ray: a local Ray instance
# started by this process (and its workers) then listens on 127.0.0.1 only.
if not os.environ.get("RAY_ADDRESS"):
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import structlog  # noqa: E402

from actors.logs import configure_logging  # noqa: E402
from actors.models import ModelError  # noqa: E402
from actors.trainer import TrainError, prepare_run, train  # noqa: E402
from configs import ConfigError  # noqa: E402
from envs import EnvError, env_class, make, names  # noqa: E402

log = structlog.get_logger()


def cmd_train(args: argparse.Namespace) -> int:
    config, run_dir = prepare_run(args.config, args.set, args.resume)
    configure_logging(config.logging.level)
    log.info("run directory", path=str(run_dir.path), model=config.model.name, env=config.env.name)
    last = train(config, run_dir, resume=bool(args.resume))
    if last:
        print(
            f"finished iteration {last['iteration']}: success_rate={last['success_rate']:.3f} "
            f"mean_reward={last['mean_reward']:.3f}; run directory: {run_dir.path}"
        )
    return 0


def cmd_envs(args: argparse.Namespace) -> int:
    print(f"{'env':<12} {'split':<6} {'tasks':>8}")
    for name in names():
        env = make(name)
        for split in ("train", "test"):
            print(f"{name:<12} {split:<6} {len(env.tasks(split)):>8}")
        env.close()
        doc = (env_class(name).__doc__ or "").strip().splitlines()
        if doc:
            print(f"  {doc[0]}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agentgym-rl", description="Multi-turn RL for LLM agents on Ray.")
    sub = parser.add_subparsers(dest="command", required=True)

    p_train = sub.add_parser("train", help="train a policy (default config: configs/quickstart.yaml)")
    p_train.add_argument("config", nargs="?", default=None, help="YAML config file or preset name")
    p_train.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, e.g. trainer.iterations=2",
    )
    p_train.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its latest checkpoint")
    p_train.set_defaults(func=cmd_train)

    p_envs = sub.add_parser("envs", help="list environments with their splits and task counts")
    p_envs.set_defaults(func=cmd_envs)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, TrainError, ModelError, EnvError) as exc:
        print(f"agentgym-rl: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("agentgym-rl: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

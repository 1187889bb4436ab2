"""The ``agentgym-rl`` command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

# The entry point sets Ray's loopback switch before anything imports ray: a local Ray instance
# started by this process (and its workers) then listens on 127.0.0.1 only.
if not os.environ.get("RAY_ADDRESS"):
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import pydantic
import structlog

from agentgym_rl.actors.cluster import stop_on_signals, stopped
from agentgym_rl.actors.logs import configure_logging
from agentgym_rl.actors.rundir import RunDir
from agentgym_rl.actors.threads import thread_cap
from agentgym_rl.configs import load_config
from agentgym_rl.configs.errors import AgentGymError
from agentgym_rl.configs.loader import format_validation_error, one_line, port_argument
from agentgym_rl.configs.targets import import_target
from agentgym_rl.driver.errors import TrainError
from agentgym_rl.envs import EnvError, env_class, make, names
from agentgym_rl.envs.http.cli import add_server_arguments, parse_options, run_server
from agentgym_rl.envs.http.models import PROTOCOLS

if TYPE_CHECKING:
    from agentgym_rl.driver.trainer import RunEnd

log = structlog.get_logger()
# `train --time-limit` stopped the run with iterations left: not an error (2), and not a signal (128 + N).
TIME_LIMIT_EXIT = 3
# `plan`: the run would not fit in GPU memory (the plan says where).
PLAN_DOES_NOT_FIT = 1


class UsageError(AgentGymError):
    """A command line argparse refuses: an unknown option, a missing argument, a value of the wrong type."""


class Parser(argparse.ArgumentParser):
    """argparse whose errors take the one error path: one line on stderr, exit status 2."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")


def cmd_train(args: argparse.Namespace) -> int:
    # torch and transformers load here, not at start: `envs`, `env-server`, `--help` and a bad option answer in a
    # second, not in the 8 s of CPU those imports cost
    from agentgym_rl.driver.run import prepare_run, train

    started = time.monotonic()
    if args.time_limit is not None and not args.time_limit > 0:
        raise TrainError(f"--time-limit {args.time_limit:g}: give a positive number of seconds")
    if args.from_checkpoint is not None and not args.resume:
        raise TrainError(f"--from {args.from_checkpoint}: give the run too, --resume RUN_DIR --from iter_N")
    configure_logging()  # what loading the config warns about (e.g. keys dropped for a new algorithm)
    # Every part of the checkpoint is checked before the config is rewritten or Ray starts.
    checkpoint = RunDir(Path(args.resume)).resume_checkpoint(args.from_checkpoint) if args.resume else None
    config, run_dir = prepare_run(args.config, args.set, args.resume)
    if checkpoint is not None:
        run_dir.set_aside_after(checkpoint)  # the run goes on from `checkpoint`: the trainer resumes the latest
    configure_logging(config.logging.level)
    envs = [entry.name for entry in config.envs] or config.env.name
    log.info("run directory", path=str(run_dir.path), model=config.model.name, env=envs)
    stop_on_signals()
    try:
        stop_by = None if args.time_limit is None else started + args.time_limit
        end = train(config, run_dir, resume=bool(args.resume), stop_by=stop_by)
    except KeyboardInterrupt as interrupt:
        stop = stopped(interrupt)
        print(
            f"agentgym-rl: stopped by {stop.signal_name}; the run directory keeps every finished checkpoint. "
            f"Continue with: agentgym-rl train --resume {run_dir.path}",
            file=sys.stderr,
        )
        return stop.exit_code
    print(
        summary_line(end, config.trainer.mode, args.time_limit, run_dir.path),
        file=sys.stderr if end.stopped_early else sys.stdout,
    )
    return TIME_LIMIT_EXIT if end.stopped_early else 0


def summary_line(end: RunEnd, mode: str, time_limit: float | None, run_dir: Path) -> str:
    """The one line ``train`` ends with: where the run stopped, its last iteration's success and reward, and
    where it is (``--resume`` continues a run that ``--time-limit`` stopped early)."""
    if not end.last:
        return f"nothing to train: the run in {run_dir} already finished its {end.iterations} iterations ({mode})"
    last = end.last
    scores = f"success_rate={last['success_rate']:.3f} mean_reward={last['mean_reward']:.3f}"
    if end.stopped_early:
        return (
            f"agentgym-rl: stopped before --time-limit {time_limit:g} s after iteration {last['iteration']} of "
            f"{end.iterations}, checkpointed ({mode}: {scores}). Continue with: agentgym-rl train --resume {run_dir}"
        )
    return f"finished iteration {last['iteration']} of {end.iterations} ({mode}): {scores}; run directory: {run_dir}"


def cmd_plan(args: argparse.Namespace) -> int:
    from agentgym_rl.driver.plan import format_plan, plan_for
    from agentgym_rl.driver.run import algorithm_keys, check_algorithm

    config = load_config(args.config, args.set, algorithm_keys=algorithm_keys)
    check_algorithm(config)
    plan = plan_for(config, gpu_memory_gib=args.gpu_memory_gib, gpus_per_node=args.gpus_per_node)
    print(format_plan(plan))
    return 0 if plan.fits else PLAN_DOES_NOT_FIT


def cmd_export(args: argparse.Namespace) -> int:
    from agentgym_rl.driver.export import export_merged

    target = export_merged(args.checkpoint, args.output)
    print(f"wrote a merged Hugging Face model to {target}")
    return 0


def cmd_view(args: argparse.Namespace) -> int:
    # Imported here: the viewer pulls in FastAPI and uvicorn, which train and envs never need.
    from agentgym_rl.serve.viewer import serve_viewer

    serve_viewer(Path(args.run_dir), host=args.host, port=args.port)
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    # Imported here: only plot needs matplotlib.
    from agentgym_rl.driver.plot import parse_run_arguments, plot_runs

    output = plot_runs(parse_run_arguments(args.runs), Path(args.output), smooth=args.smooth, title=args.title)
    print(f"wrote {output}")
    return 0


# The env servers of protocols beside AgentGym's, by `--protocol` value: imported only when asked for, since each
# needs its extra (whose absence is a one-line error).
SERVERS = {"openenv": "agentgym_rl.envs.openenv.server:serve_openenv"}


def cmd_env_server(args: argparse.Namespace) -> int:
    target = SERVERS.get(args.protocol)
    return run_server(args, import_target(target) if target else None)


def cmd_serve(args: argparse.Namespace) -> int:
    # Imported here: Ray Serve and FastAPI are only needed by this command.
    from agentgym_rl.serve.cli import run_serve

    return run_serve(args)


def cmd_eval(args: argparse.Namespace) -> int:
    # Imported here: only eval needs the evaluation module and its scipy import.
    from agentgym_rl.driver.evaluate import EvalError, EvalOptions, format_table, run_eval

    envs = list(dict.fromkeys(args.env))
    if len(envs) > 1 and args.output is not None:
        raise EvalError(
            f"--output names one report, but {len(envs)} envs are evaluated; leave it out and "
            "each env's report goes to its default path (<run>/eval/<env>-<split>-<iter>.json or ./eval/)"
        )
    configure_logging("info")
    # Stopped part-way, an eval keeps the reports of the envs it finished.
    stop_on_signals()
    for env in envs:
        try:
            options = EvalOptions(
                checkpoint=args.checkpoint,
                model=args.model,
                env=env,
                split=args.split,
                episodes=args.episodes,
                max_turns=args.max_turns,
                samples=args.samples,
                temperature=args.temperature,
                seed=args.seed,
                output=args.output,
                config=args.config,
                overrides=args.set,
            )
        except pydantic.ValidationError as exc:
            raise EvalError(format_validation_error(exc, "eval options")) from None
        report, path = run_eval(options)
        print(f"{env} ({options.split}, {options.samples} episode(s) per task, at most {report['max_turns']} turns)")
        print(format_table(report))
        print(f"report: {path}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    # Imported here: like eval, only compare needs the evaluation module.
    from agentgym_rl.driver.compare import (
        CompareError,
        compare_reports,
        compare_table,
        format_compare_table,
        format_comparison,
        labelled_reports,
    )

    if len(args.reports) < 2:
        raise CompareError(f"compare needs two reports or more, got {len(args.reports)}: A.json B.json [C.json ...]")
    # A label stands in for the report's name wherever the output names it.
    (base_label, base), *rows = [(label, {**report, "name": label}) for label, report in labelled_reports(args.reports)]
    if len(rows) == 1:
        comparison = compare_reports(base, rows[0][1])
        print(format_comparison(comparison))
    else:
        comparison = compare_table((base_label, base), rows)
        print(format_compare_table(comparison))
    if args.output is not None:
        output = Path(args.output)
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(comparison, indent=2))
        print(f"comparison: {output}")
    return 0


def cmd_data(args: argparse.Namespace) -> int:
    # Imported here: only the data commands need the export format.
    from agentgym_rl.driver.data import export_run, import_episodes

    if args.data_command == "export":
        run_dir = Path(args.run_dir)
        output = Path(args.output) if args.output else run_dir / "export.jsonl"
        count = export_run(run_dir, output)
        print(f"exported {count} episodes to {output}")
    else:
        count = import_episodes(Path(args.file), Path(args.run_dir), args.model)
        print(f"imported {count} episodes into {Path(args.run_dir) / 'trajectories'}")
    return 0


def cmd_envs(args: argparse.Namespace) -> int:
    if (args.env is None) != (not args.instruction and args.tasks is None):
        raise AgentGymError("envs: give an ENV together with --instruction or --tasks SPLIT, or neither")
    if args.env is not None:
        return show_env(args)
    print(f"{'env':<16} {'split':<6} {'tasks':>8}")
    for name in names():
        cls = env_class(name)
        doc = (cls.__doc__ or "").strip().splitlines()
        options = getattr(cls, "Options", None)
        required = [key for key, field in options.model_fields.items() if field.is_required()] if options else []
        if required:
            # e.g. a remote env: its tasks live on a server whose address only the user knows
            settings = ", ".join(f"env.options.{key}" for key in required)
            print(f"{name:<16} {'-':<6} {'-':>8}  (needs options: {settings})")
        else:
            try:
                env = make(name)
            except (EnvError, pydantic.ValidationError) as exc:
                # e.g. SciWorld without Java
                reason = str(exc).strip().splitlines()[0]
                print(f"{name:<16} {'-':<6} {'-':>8}  (cannot list here: {reason})")
            else:
                try:
                    for split in ("train", "test"):
                        print(f"{name:<16} {split:<6} {len(env.tasks(split)):>8}")
                finally:
                    env.close()
        if doc:
            print(f"  {doc[0].replace('``', '')}")
    return 0


def show_env(args: argparse.Namespace) -> int:
    """One env's system prompt (``--instruction``) or a split's task ids (``--tasks SPLIT``), for agents
    written outside this project."""
    try:
        options = parse_options(args.options)
    except (ValueError, TypeError) as exc:
        raise AgentGymError(str(exc)) from exc
    try:
        env = make(args.env, options)
    except pydantic.ValidationError as exc:
        raise AgentGymError(format_validation_error(exc, f"{args.env} --options")) from exc
    try:
        if args.instruction and args.action_format == "tools":
            if not env.functions():
                raise AgentGymError(f"envs: {args.env} describes no functions; its only action format is text")
            print(env.tool_instruction)
        else:
            print(env.instruction if args.instruction else " ".join(map(str, env.tasks(args.tasks))))
    finally:
        env.close()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="agentgym-rl", description="Multi-turn RL for LLM agents on Ray.")
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
    p_train.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR from its latest checkpoint (every file of it is checked first; a damaged "
        "one is named, exit status 2)",
    )
    p_train.add_argument(
        "--from",
        dest="from_checkpoint",
        metavar="iter_N",
        help="with --resume: continue from the earlier checkpoint iter_N instead (e.g. when the latest is damaged); "
        "the newer ones are moved to RUN_DIR/checkpoints/superseded/",
    )
    p_train.add_argument(
        "--time-limit",
        type=float,
        metavar="SECONDS",
        help="stop, checkpointed, after the last iteration that ends within SECONDS of the start (judged by the "
        f"longest iteration so far); exit status {TIME_LIMIT_EXIT} when iterations remain (continue with --resume)",
    )
    p_train.set_defaults(func=cmd_train)

    p_plan = sub.add_parser(
        "plan",
        help="the placement and per-GPU memory a run would get, before it starts; exit status "
        f"{PLAN_DOES_NOT_FIT} when it would not fit (train refuses such a run)",
    )
    p_plan.add_argument("config", nargs="?", default=None, help="YAML config file or preset name")
    p_plan.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key, as for train"
    )
    p_plan.add_argument(
        "--gpu-memory-gib",
        type=float,
        metavar="N",
        help="memory of each GPU in GiB (default: ray.gpu_memory_gib, else the GPU this machine sees, else 79.65, "
        "an 80 GB H100's)",
    )
    p_plan.add_argument(
        "--gpus-per-node",
        type=int,
        metavar="N",
        help="GPUs of each node the actors are packed into (default: this machine's GPUs, else 8)",
    )
    p_plan.set_defaults(func=cmd_plan)

    p_view = sub.add_parser("view", help="trajectory viewer web page for a run directory (follows a live run)")
    p_view.add_argument("run_dir", metavar="RUN_DIR", help="run directory made by train")
    p_view.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p_view.add_argument("--port", type=port_argument, default=8265, help="port to listen on (default 8265)")
    p_view.set_defaults(func=cmd_view)

    p_server = sub.add_parser(
        "env-server", help="serve an env over AgentGym's HTTP protocol, or OpenEnv's (--protocol openenv)"
    )
    add_server_arguments(p_server, (*PROTOCOLS, *SERVERS))
    p_server.set_defaults(func=cmd_env_server)

    p_serve = sub.add_parser("serve", help="serve a policy over HTTP (OpenAI-compatible chat, /v1/act)")
    source = p_serve.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--checkpoint",
        metavar="DIR",
        help="a run's checkpoints/iter_N dir, a run dir (its latest checkpoint) or a model or adapter dir",
    )
    source.add_argument("--model", metavar="NAME", help="built-in model name or local Hugging Face directory")
    p_serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p_serve.add_argument("--port", type=port_argument, default=8000, help="port to listen on (default 8000)")
    p_serve.add_argument("--api-key", default=None, help="require this bearer key (default: $AGENTGYM_RL_API_KEY)")
    p_serve.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="serve.KEY=VALUE",
        help="a serve setting (engine, max_batch_size, kv_cache_tokens, max_queued_requests, max_n, ...), or "
        "model.tool_format / model.tool_template (how tool calls are written and rendered); repeatable",
    )
    p_serve.set_defaults(func=cmd_serve)

    p_eval = sub.add_parser("eval", help="evaluate a checkpoint or model on an env split (success, score, pass@K)")
    policy = p_eval.add_mutually_exclusive_group(required=True)
    policy.add_argument("--checkpoint", metavar="DIR", help="a run's checkpoints/iter_N dir, a run dir or a model dir")
    policy.add_argument("--model", metavar="NAME", help="built-in model name or local Hugging Face directory")
    p_eval.add_argument(
        "--env",
        required=True,
        action="append",
        help="registered env name (see `agentgym-rl envs`); repeat it to evaluate several envs, one report each",
    )
    p_eval.add_argument("--split", default="test", help="split to evaluate on (default test)")
    p_eval.add_argument("--episodes", type=int, default=None, help="tasks to play, evenly spaced (default: all)")
    p_eval.add_argument("--max-turns", type=int, default=None, help="turn limit (default: the paper's for the env)")
    p_eval.add_argument("--samples", type=int, default=1, help="episodes per task, K of pass@K (default 1)")
    p_eval.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1.0)")
    p_eval.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p_eval.add_argument("--output", metavar="FILE", help="JSON report path (default: <run>/eval/<name>.json)")
    p_eval.add_argument(
        "--config",
        metavar="FILE",
        help="config whose sampler and env settings --model or a bare model dir plays with (default: the defaults; "
        "a run's checkpoint always uses its run's config)",
    )
    p_eval.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key of the samplers"
    )
    p_eval.set_defaults(func=cmd_eval)

    p_merged = sub.add_parser(
        "export", help="write a checkpoint's policy as a Hugging Face model directory (a LoRA adapter merged in)"
    )
    p_merged.add_argument(
        "--checkpoint", required=True, metavar="DIR", help="a run's checkpoints/iter_N dir, a run dir or an adapter dir"
    )
    p_merged.add_argument("--output", required=True, metavar="DIR", help="new directory to write the model to")
    p_merged.set_defaults(func=cmd_export)

    p_compare = sub.add_parser(
        "compare",
        help="paired comparison of two eval reports (success difference B - A, exact McNemar p), or a table of "
        "several, each against the first (with Holm-adjusted p values)",
    )
    p_compare.add_argument(
        "reports",
        nargs="+",
        metavar="[LABEL=]REPORT.json",
        help="reports written by `agentgym-rl eval` (same env, split, episodes and --seed): A, then B, or B, C, ... "
        "for the table; LABEL names a report in the output (default: its name)",
    )
    p_compare.add_argument("--output", metavar="FILE", help="also write the comparison as JSON to FILE")
    p_compare.set_defaults(func=cmd_compare)

    p_data = sub.add_parser("data", help="export a run's trajectories, or import episodes for offline training")
    data_sub = p_data.add_subparsers(dest="data_command", required=True)
    p_export = data_sub.add_parser("export", help="write a run's trajectories as episode JSONL")
    p_export.add_argument("run_dir", metavar="RUN_DIR", help="run directory made by train")
    p_export.add_argument("--output", metavar="FILE", help="output file (default: RUN_DIR/export.jsonl)")
    p_import = data_sub.add_parser("import", help="turn episode JSONL into a run directory's trajectories/")
    p_import.add_argument("file", metavar="FILE", help="episode JSONL (the export format)")
    p_import.add_argument("--run-dir", required=True, metavar="DIR", help="directory to write trajectories/ into")
    p_import.add_argument(
        "--model",
        default="smollm2-135m-instruct",
        help="model whose chat template renders episodes without token ids (default smollm2-135m-instruct)",
    )
    p_data.set_defaults(func=cmd_data)

    p_plot = sub.add_parser("plot", help="plot runs' success rate and horizon per iteration as a PNG")
    p_plot.add_argument("runs", nargs="+", metavar="[LABEL=]RUN_DIR", help="run directories made by train")
    p_plot.add_argument("--output", required=True, metavar="FILE", help="PNG file to write")
    p_plot.add_argument("--smooth", type=int, default=1, help="trailing mean of the success rate over N iterations")
    p_plot.add_argument("--title", default=None, help="figure title")
    p_plot.set_defaults(func=cmd_plot)

    p_envs = sub.add_parser(
        "envs",
        help="list environments with their splits and task counts, or print one env's system prompt or task ids",
    )
    p_envs.add_argument("env", nargs="?", metavar="ENV", help="one env, with --instruction or --tasks")
    shown = p_envs.add_mutually_exclusive_group()
    shown.add_argument("--instruction", action="store_true", help="print ENV's system prompt")
    shown.add_argument("--tasks", metavar="SPLIT", help="print the task ids of ENV's SPLIT, space-separated")
    p_envs.add_argument("--options", default="{}", help="ENV's options as JSON, e.g. '{\"test_seeds\": 50}'")
    p_envs.add_argument(
        "--action-format",
        choices=["text", "tools"],
        default="text",
        help="with --instruction: the system prompt of that action format (env.action_format)",
    )
    p_envs.set_defaults(func=cmd_envs)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        thread_cap()  # a bad cap is refused here in one line, not in every actor's start
        return args.func(args)
    except AgentGymError as exc:
        print(f"agentgym-rl: error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as interrupt:
        stop = stopped(interrupt)
        print(f"agentgym-rl: stopped by {stop.signal_name}", file=sys.stderr)
        return stop.exit_code


if __name__ == "__main__":
    sys.exit(main())

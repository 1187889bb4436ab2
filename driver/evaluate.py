"""``agentgym-rl eval``: play a policy on an env split and report success, score, pass@K and intervals.

The metric functions at the top are pure (no Ray, no I/O). ``run_eval`` plays the episodes through
real ``SamplerActor``s on Ray with the paper's evaluation protocol by default: temperature 1 and a
per-env turn limit (BabyAI 20, SciWorld 30, TextCraft 30, Deep Search 30, WebArena 15).
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import ray
import structlog
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from scipy import stats

from agentgym_rl.actors.adapters import is_policy_dir, policy_source
from agentgym_rl.actors.cluster import init_ray, node_capacities, plan_actors
from agentgym_rl.actors.model_store import model_dir
from agentgym_rl.actors.rundir import CONFIG_FILE, POLICY_DIR, RunDir, latest_if_run
from agentgym_rl.actors.sampler import EpisodeRequest
from agentgym_rl.actors.trajectory import Trajectory
from agentgym_rl.configs import Config, ConfigError, load_config
from agentgym_rl.configs.engines import refuse_simulated
from agentgym_rl.configs.errors import AgentGymError
from agentgym_rl.configs.loader import apply_override, format_validation_error
from agentgym_rl.driver.mix import check_action_format, check_oracle
from agentgym_rl.driver.needs import pool_need
from agentgym_rl.driver.samplers import SamplerGroup
from agentgym_rl.envs import env_class, make

log = structlog.get_logger()

DEFAULT_TEMPERATURE = 1.0
Z_95 = 1.959963984540054  # standard normal quantile of 0.975


class EvalError(AgentGymError, ValueError):
    """An evaluation that cannot run; the message names the bad argument and what to do."""


# ----------------------------------------------------------------------------- pure metrics


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one task from ``n`` samples with ``c`` successes: 1 - C(n-c, k) / C(n, k).

    (Chen et al. 2021, "Evaluating Large Language Models Trained on Code".)
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def wilson_interval(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval of a success rate (95 % for the default ``z``)."""
    if n < 1 or not 0 <= successes <= n:
        raise ValueError(f"wilson_interval needs n >= 1 and 0 <= successes <= n, got {successes}/{n}")
    p = successes / n
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, center - half), min(1.0, center + half)


def mean_interval(values: Sequence[float], confidence: float = 0.95) -> tuple[float, float] | None:
    """Student-t interval of the mean of ``values``; None for fewer than two values."""
    n = len(values)
    if n < 2:
        return None
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = float(stats.t.ppf((1 + confidence) / 2, n - 1)) * sd / math.sqrt(n)
    return mean - half, mean + half


class EpisodeResult(BaseModel):
    """The evaluation record of one episode."""

    model_config = ConfigDict(extra="forbid")

    task_id: int
    sample: int = Field(description="Index of this episode among the task's samples.")
    seed: int = Field(description="Seed of the episode's sampling stream (`episode_seeds`); pairs episodes in compare.")
    category: str = Field(description="Task category: the env's `task_category` (BabyAI level, TextCraft depth, ...).")
    success: bool
    score: float = Field(description="Outcome score: the env's `episode_score` of the reward (0-100 for SciWorld).")
    turns: int
    truncated: bool
    failed: bool = Field(False, description="The env failed (died or timed out); counted as unsuccessful.")


def summarize(results: Sequence[EpisodeResult], k: int) -> dict:
    """Success rate (= avg@k), mean score, pass@k and their intervals over ``results``.

    ``pass@k`` averages the unbiased per-task estimate over tasks with at least ``k`` samples;
    intervals treat episodes as independent (samples of one task are not, so they are optimistic
    when k > 1).
    """
    if not results:
        raise ValueError("summarize needs at least one episode result")
    by_task: dict[int, list[EpisodeResult]] = defaultdict(list)
    for result in results:
        by_task[result.task_id].append(result)
    successes = sum(r.success for r in results)
    scores = [r.score for r in results]
    per_task_rate = [sum(r.success for r in runs) / len(runs) for runs in by_task.values()]
    eligible = [runs for runs in by_task.values() if len(runs) >= k]
    return {
        "tasks": len(by_task),
        "episodes": len(results),
        "success_rate": successes / len(results),
        "success_rate_ci95": wilson_interval(successes, len(results)),
        "mean_score": sum(scores) / len(scores),
        "mean_score_ci95": mean_interval(scores),
        f"avg@{k}": sum(per_task_rate) / len(per_task_rate),
        f"pass@{k}": (
            sum(pass_at_k(len(runs), sum(r.success for r in runs), k) for runs in eligible) / len(eligible)
            if eligible
            else None
        ),
        "truncated_rate": sum(r.truncated for r in results) / len(results),
        "turns_mean": sum(r.turns for r in results) / len(results),
        "failed_rate": sum(r.failed for r in results) / len(results),
    }


def summarize_by_category(results: Sequence[EpisodeResult], k: int) -> dict[str, dict]:
    """``summarize`` per task category, categories sorted by name."""
    groups: dict[str, list[EpisodeResult]] = defaultdict(list)
    for result in results:
        groups[result.category].append(result)
    return {name: summarize(groups[name], k) for name in sorted(groups)}


# ----------------------------------------------------------------------------- turn limits and tasks


def eval_turn_limit(env_name: str, max_turns: int | None) -> int:
    """``max_turns`` when given, else the env's ``default_max_turns`` (the paper's evaluation limit: BabyAI 20,
    SciWorld, TextCraft and Deep Search 30, the web envs 15).

    Raises:
        EvalError: neither is set (the env has no published limit).
        EnvError: ``env_name`` is not a registered env.
    """
    limit = max_turns or env_class(env_name).default_max_turns
    if limit is None:
        raise EvalError(f"env {env_name!r} has no published turn limit; pass --max-turns N")
    return limit


def pick_tasks(tasks: Sequence[int], episodes: int | None) -> list[int]:
    """All of ``tasks``, or ``episodes`` of them evenly spaced (so every category is reached)."""
    if episodes is None:
        return list(tasks)
    if not 1 <= episodes <= len(tasks):
        raise EvalError(f"--episodes {episodes}: the split has {len(tasks)} tasks; choose 1..{len(tasks)}")
    return [tasks[i * len(tasks) // episodes] for i in range(episodes)]


# ----------------------------------------------------------------------------- running


class EvalOptions(BaseModel):
    """Arguments of ``agentgym-rl eval``."""

    model_config = ConfigDict(extra="forbid")

    checkpoint: str | None = Field(None, description="A checkpoint dir (with policy/), a run dir (its latest).")
    model: str | None = Field(None, description="A built-in model name or local Hugging Face directory.")
    env: str = Field(description="Registered env name.")
    split: str = Field("test", description="Split whose tasks are played.")
    episodes: int | None = Field(None, ge=1, description="Tasks to play (evenly spaced over the split); None: all.")
    max_turns: int | None = Field(None, ge=1, description="Turn limit; None: the paper's value for the env.")
    samples: int = Field(1, ge=1, description="Episodes per task (K of pass@K and avg@K).")
    temperature: float = Field(DEFAULT_TEMPERATURE, gt=0.0, description="Sampling temperature.")
    seed: int = Field(0, description="Seed of every episode's sampling stream.")
    output: str | None = Field(None, description="JSON report path; None: <run>/eval/<name>.json or ./eval/.")
    config: str | None = Field(
        None, description="Config file whose sampler and env settings a `--model` or bare model dir plays with."
    )
    overrides: list[str] = Field(default_factory=list, description="`--set key=value` config overrides.")


def resolve_checkpoint(path: str) -> tuple[Path, Path, RunDir | None]:
    """(checkpoint dir, policy model or adapter dir, run dir holding it or None) for ``--checkpoint``.

    A checkpoint's own ``policy/`` directory counts as that checkpoint, so the run's sampler settings
    (token budgets) apply to it as they do to the checkpoint.
    """
    folder = Path(path).expanduser()
    if folder.name == POLICY_DIR and folder.parent.parent.name == "checkpoints":
        folder = folder.parent
    try:
        folder = latest_if_run(folder)
    except FileNotFoundError as exc:
        raise EvalError(f"--checkpoint {path}: run directory without a complete checkpoint") from exc
    if is_policy_dir(folder / POLICY_DIR):
        policy = folder / POLICY_DIR
    elif is_policy_dir(folder):
        policy = folder
    else:
        raise EvalError(
            f"--checkpoint {path}: neither a {POLICY_DIR}/ model or adapter nor a model or adapter directory; give "
            "a run's checkpoints/iter_N directory, a run directory, a Hugging Face model directory or a LoRA "
            "adapter directory"
        )
    run_root = folder.parent.parent
    in_run = folder.parent.name == "checkpoints" and (run_root / CONFIG_FILE).is_file()
    return folder, policy, RunDir(run_root) if in_run else None


def build_config(options: EvalOptions, policy: str, run_dir: RunDir | None) -> Config:
    """The run's config (else ``--config``, else the defaults) with the policy, env, split, temperature, seed
    and overrides.

    Raises:
        EvalError: ``--config`` with a checkpoint of a run, which plays with its run's config.
        SimulatedEngineError: the engine is a simulation (``modelled``), which no evaluation may use.
    """
    if run_dir is not None and options.config is not None:
        raise EvalError(
            f"--config {options.config}: a checkpoint of a run plays with its run's config "
            f"({run_dir.path / CONFIG_FILE}); --config is for --model or a bare model directory, --set changes a key"
        )
    if run_dir is not None:
        base = load_config(run_dir.path / CONFIG_FILE)
    else:
        base = load_config(options.config) if options.config is not None else Config()
    data = base.model_dump(mode="json")
    # The env's options as the run trained it: its `envs` entry in a multi-env run, else `env` if it is that env.
    trained = [entry for entry in data.pop("envs") if entry["name"] == options.env] or [data["env"]]
    same_env = trained[0]["name"] == options.env
    env_options = trained[0]["options"] if same_env else {}
    # The action format too: a policy trained in tool format is evaluated in it (`--set env.action_format=...`).
    action_format = trained[0]["action_format"] if same_env else "text"
    data["model"]["name"], data["model"]["adapter"] = policy_source(policy)
    data["env"] = {"name": options.env, "split": options.split, "options": env_options, "action_format": action_format}
    data["sampler"]["policy"] = "model"
    data["sampler"]["sampling"]["temperature"] = options.temperature
    data["run"]["seed"] = options.seed
    for item in options.overrides:
        apply_override(data, item)
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, "eval settings")) from None
    refuse_simulated(config.sampler.engine, "agentgym-rl eval")
    check_action_format(config.env.name, config.env.action_format, "env")
    if config.sampler.policy == "oracle":
        check_oracle(config.env.name, config.env.options, "env")
    return config


def episode_seeds(seed: int, task_id: int, samples: int) -> list[int]:
    """The sampling seeds of a task's ``samples`` episodes under eval seed ``seed``, by sample.

    They depend on the eval seed, task and sample only, so a rerun samples the same tokens and two
    policies evaluated with the same seed play each episode from the same seed.
    """
    return [int(s) for s in np.random.SeedSequence([seed, task_id]).generate_state(samples)]


def play(config: Config, tasks: list[int], samples: int, max_turns: int) -> tuple[list[tuple[int, Trajectory]], dict]:
    """Play every task ``samples`` times on a sampler group sized like a run's (``sampler.count`` samplers as the
    cluster has room, at least ``sampler.min_count``); a task whose sampler dies is played again, from the same
    seeds, on a survivor. Returns the (seed, trajectory) pairs by task, then sample, and the group's ``pool/*``
    counts (samplers lost, task groups moved).

    Raises:
        ClusterError: the pool's minimum does not fit the cluster.
        PoolError: every sampler died and the cluster has no room for another.
        SamplerFailed: code inside a sampler raised (its env or engine failed).
    """
    samplers = SamplerGroup(config)
    samplers.start([config], plan_actors(node_capacities(), [], [pool_need(config.env.name, config.sampler)]))
    calls, seeds = {}, []
    for group, task_id in enumerate(tasks):
        seeds.append(episode_seeds(config.run.seed, task_id, samples))
        requests = [EpisodeRequest(task_id=task_id, group=group, seed=seed, horizon=max_turns) for seed in seeds[-1]]
        calls[samplers.submit(requests)] = group
    # Tasks finish in any order; the log reports progress about every tenth of them.
    played: dict[int, list[Trajectory]] = {}
    every, successes = max(len(tasks) // 10, 1), 0
    for group, _, trajectories in samplers.completed(calls, None):
        played[group] = trajectories
        successes += sum(t.success for t in trajectories)
        if len(played) % every == 0 or len(played) == len(tasks):
            episodes = len(played) * samples
            log.info("eval progress", tasks=f"{len(played)}/{len(tasks)}", success_rate=round(successes / episodes, 3))
    # collect returns a call's trajectories in the order of its requests, so they line up with its seeds.
    pairs = [pair for group, task_seeds in enumerate(seeds) for pair in zip(task_seeds, played[group], strict=True)]
    return pairs, samplers.metrics(None)


def run_eval(options: EvalOptions) -> tuple[dict, Path]:
    """Evaluate; returns the report and the path of its JSON file (written)."""
    if (options.checkpoint is None) == (options.model is None):
        raise EvalError("give exactly one of --checkpoint DIR or --model NAME")
    run_dir = None
    if options.checkpoint is not None:
        checkpoint, policy, run_dir = resolve_checkpoint(options.checkpoint)
        source_name = checkpoint.name
        policy_name = str(policy)
    else:
        policy_name = options.model
        source_name = Path(options.model).name
    max_turns = eval_turn_limit(options.env, options.max_turns)
    config = build_config(options, policy_name, run_dir)
    if config.sampler.policy == "oracle":  # `--set sampler.policy=oracle`: the env's expert plays, not the model
        policy_name = source_name = "oracle"
    model_dir(config.model.name)  # build a built-in model once here, before samplers race to do it
    env = make(config.env.name, config.env.options)
    try:
        tasks = pick_tasks(list(env.tasks(options.split)), options.episodes)
        init_ray(config)
        try:
            episodes, pool_counts = play(config, tasks, options.samples, max_turns)
        finally:
            ray.shutdown()
        per_task = defaultdict(int)
        results = []
        for seed, trajectory in episodes:
            results.append(
                EpisodeResult(
                    task_id=trajectory.task_id,
                    sample=per_task[trajectory.task_id],
                    seed=seed,
                    category=env.task_category(trajectory.task_id),
                    success=trajectory.success,
                    score=env.episode_score(trajectory.reward),
                    turns=trajectory.num_turns,
                    truncated=trajectory.truncated,
                    failed=trajectory.failed,
                )
            )
            per_task[trajectory.task_id] += 1
    finally:
        env.close()
    played_as = "-tools" if config.env.action_format == "tools" else ""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{options.env}{played_as}-{options.split}-{source_name}")
    report = {
        "name": name,
        "policy": policy_name,
        "checkpoint": options.checkpoint,
        "env": options.env,
        "split": options.split,
        "action_format": config.env.action_format,
        "engine": config.sampler.engine,
        "samples": options.samples,
        "max_turns": max_turns,
        "temperature": options.temperature,
        "seed": options.seed,
        "max_new_tokens": config.sampler.sampling.max_new_tokens,
        "max_context_tokens": config.sampler.max_context_tokens,
        "samplers_lost": int(pool_counts["pool/samplers_lost"]),
        "tasks_replayed": int(pool_counts["pool/redispatched"]),
        "overall": summarize(results, options.samples),
        "categories": summarize_by_category(results, options.samples),
        "results": [r.model_dump() for r in results],
    }
    if options.output is not None:
        path = Path(options.output)
    elif run_dir is not None:
        path = run_dir.path / "eval" / f"{name}.json"
    else:
        path = Path("eval") / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))
    return report, path


def format_table(report: dict) -> str:
    """The overall and per-category rows of ``report`` as a fixed-width text table."""
    k = report["samples"]
    header = f"{'category':<40} {'tasks':>5} {'eps':>5} {'success [95% CI]':>22} {'score [95% CI]':>26}"
    header += f" {f'pass@{k}':>7} {'trunc':>6}"
    rows = [header, "-" * len(header)]
    for name, row in [("overall", report["overall"]), *report["categories"].items()]:
        low, high = row["success_rate_ci95"]
        success = f"{row['success_rate']:.3f} [{low:.3f}, {high:.3f}]"
        ci = row["mean_score_ci95"]
        score = f"{row['mean_score']:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci is not None else "")
        passed = row[f"pass@{k}"]
        rows.append(
            f"{name[:40]:<40} {row['tasks']:>5} {row['episodes']:>5} {success:>22} {score:>26} "
            f"{'-' if passed is None else f'{passed:.3f}':>7} {row['truncated_rate']:>6.2f}"
        )
    return "\n".join(rows)

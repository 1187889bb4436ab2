"""``SamplerActor``: plays many episodes at once and batches their generation requests.

Each episode is a coroutine (``actors.rollout.run_episode``). Episodes that are waiting for the
model put their prompt on a queue; one batching loop takes every pending prompt, runs a single
batched ``generate`` in a worker thread (torch releases the GIL, so environment replies keep
arriving meanwhile) and hands the results back. A slow environment delays only its own episode.
An env actor that dies, exceeds ``sampler.env_timeout_s`` or whose env raises ``EnvUnavailable`` (the server
behind it failed) is killed and replaced (dropped instead when no node has room for a new one); its episode
is retried once from the start on a free actor, then returned as a ``failed`` record (never trained on). ``add_envs`` grows the env pool.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import time
from dataclasses import dataclass

import ray
import structlog
import torch

from agentgym_rl.actors.chat import ChatFormat
from agentgym_rl.actors.cluster import env_request, has_room, start_env_actor
from agentgym_rl.actors.engines import Generation, make_engine
from agentgym_rl.actors.heap import release_free_heap, return_large_frees_to_the_os
from agentgym_rl.actors.logs import Timeline
from agentgym_rl.actors.model_store import load_tokenizer
from agentgym_rl.actors.rollout import ToolActions, run_episode
from agentgym_rl.actors.threads import set_torch_threads
from agentgym_rl.actors.tool_formats import ToolChat, tool_format
from agentgym_rl.actors.trajectory import Trajectory
from agentgym_rl.actors.transport import DeviceIdentity, SharedWeights
from agentgym_rl.actors.weight_sync import GroupAddress
from agentgym_rl.actors.weights import WeightsPayload
from agentgym_rl.configs.schema import EnvConfig, ModelConfig, SamplerConfig
from agentgym_rl.envs.actor import EnvRestarted, hide_unreserved_gpus
from agentgym_rl.envs.base import EnvUnavailable
from agentgym_rl.envs.tools import Function

log = structlog.get_logger()

# What an env actor that died, cannot be reached or hangs raises, and what an env raises when the process or
# server behind it failed (EnvUnavailable); the episode moves to a fresh actor.
ENV_FAILURES = (
    ray.exceptions.RayActorError,
    ray.exceptions.ActorUnavailableError,
    TimeoutError,
    EnvRestarted,
    EnvUnavailable,
)


def failure_reason(exc: BaseException) -> str:
    """The first line of what ``exc`` says, naming the env's own error where an env method raised it: a
    ``RayTaskError``'s text starts with the actor's pid and address, its cause names the server that failed."""
    cause = exc.cause if isinstance(exc, ray.exceptions.RayTaskError) and exc.cause is not None else exc
    return f"{type(cause).__name__}: {cause}".splitlines()[0]


# How long the batching loop waits for the rest of the active episodes to ask for a turn before
# it generates for those already waiting. Env steps take milliseconds; generation takes far longer.
BATCH_WINDOW_S = 0.01


@dataclass(frozen=True)
class EpisodeRequest:
    """One episode to play: the task, its group (task index in the iteration) and the seed of its
    sampling stream (the trainer derives it from the run seed, so reruns sample the same tokens)."""

    task_id: int
    group: int
    seed: int
    horizon: int  # the episode's turn limit (its env's curriculum's at the iteration that launched it)


class SamplerActor:
    """Owns one engine and a set of env actors; run it with ``ray.remote`` (it is an async actor).

    Args:
        index: the sampler's number (seeds its sampling generator with ``seed + index``).
        model: model section of the config.
        sampler: sampler section of the config.
        env: env section of the config.
        seed: the run seed.
        env_actors: env actors to start with; None: ``sampler.envs_per_sampler`` (a pool starts fewer where
            the cluster has room for fewer).
    """

    def __init__(
        self,
        *,
        index: int,
        model: ModelConfig,
        sampler: SamplerConfig,
        env: EnvConfig,
        seed: int,
        env_actors: int | None = None,
    ) -> None:
        hide_unreserved_gpus()
        set_torch_threads(sampler.num_threads)
        return_large_frees_to_the_os()
        self.events = Timeline()
        self.events.add("starting")  # before the engine loads (colocated: after the learner is ready)
        self.index = index
        self.config = sampler
        self.env_config = env
        tokenizer = load_tokenizer(model.name)
        self.chat = ChatFormat(tokenizer)
        # env.action_format=tools: the env's functions are offered and each reply's first call is its action.
        self.tool_chat = (
            ToolChat(self.chat, tool_format(model.tool_format), model.tool_template)
            if env.action_format == "tools"
            else None
        )
        self.eos_token_id = tokenizer.eos_token_id
        stop_ids = [tokenizer.eos_token_id]
        self.engine = make_engine(
            sampler.engine,
            model_name=model.name,
            dtype=sampler.dtype,
            seed=seed + index,
            stop_token_ids=stop_ids,
            pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
            max_cached_tokens=sampler.episode_cache_tokens,
            fit_cache_to_memory=sampler.kv_cache_tokens is None,
            adapter=model.adapter,
            vllm=sampler.vllm,
        )
        # Each episode attempt gets its own key: the engine keeps its keys/values between turns.
        self.episode_keys = itertools.count()
        count = sampler.envs_per_sampler if env_actors is None else env_actors
        self.envs = [start_env_actor(env, sampler) for _ in range(count)]
        self.ready: set[ray.actor.ActorHandle] = set()  # env actors known to have started
        self.instruction: str | None = None
        self.functions: list[Function] = []
        self.free_envs: asyncio.Queue | None = None
        self.pending: list[tuple[list[int], torch.Generator, int, asyncio.Future]] = []
        self.wake: asyncio.Event | None = None
        self.engine_lock: asyncio.Lock | None = None
        self.batch_task: asyncio.Task | None = None
        self.collects = 0  # collect calls in flight
        self.stats = {
            "generate_calls": 0,
            "generated_tokens": 0,
            "generate_s": 0.0,
            "env_replacements": 0,
            "env_dropped": 0,
            "env_added": 0,
        }

    def _ensure_loop_state(self) -> None:
        # asyncio objects must be created on the actor's event loop, which __init__ does not run on.
        if self.wake is None:
            self.wake = asyncio.Event()
            self.engine_lock = asyncio.Lock()
            self.free_envs = asyncio.Queue()
            for handle in self.envs:
                self.free_envs.put_nowait(handle)
            self.batch_task = asyncio.get_running_loop().create_task(self._batch_loop())

    async def load_weights(self, payload_ref: list[ray.ObjectRef]) -> int:
        """Load the weights behind ``payload_ref[0]`` (wrapped in a list so Ray passes the reference)."""
        self._ensure_loop_state()
        payload: WeightsPayload = await payload_ref[0]
        async with self.engine_lock:
            await asyncio.to_thread(self.engine.load_weights, payload)
        self.events.add("weights loaded")
        return self.engine.weights_version

    async def sleep(self) -> None:
        """Let the engine give back its device memory until ``wake`` (colocated mode, while the learner trains)."""
        self._ensure_loop_state()
        async with self.engine_lock:
            await asyncio.to_thread(self.engine.sleep)
        self.events.add("asleep")

    async def wake(self) -> None:
        self._ensure_loop_state()
        async with self.engine_lock:
            await asyncio.to_thread(self.engine.wake)
        self.events.add("awake")

    async def timeline(self) -> list[tuple[float, str]]:
        """The latest events with their wall-clock times: ``asleep``, ``awake``, ``weights loaded``."""
        return self.events.read()

    async def weight_group_identities(self, adapter: bool) -> list[DeviceIdentity]:
        """Where each member of a weight group this sampler's engine takes holds its tensors (see
        ``Engine.weight_group_identities``): one per member."""
        return await asyncio.to_thread(self.engine.weight_group_identities, adapter)

    async def join_weight_group(self, address: GroupAddress, rank: int, adapter: bool) -> None:
        """Join the learner's weight group as ``rank`` (and the engine's further ranks); returns once formed."""
        await asyncio.to_thread(self.engine.join_weight_group, address, rank, adapter)

    async def receive_weights(self) -> int:
        """Receive the version the learner broadcasts now (between batches); returns the weights version."""
        self._ensure_loop_state()
        async with self.engine_lock:
            await asyncio.to_thread(self.engine.receive_weights)
        self.events.add("weights loaded")
        return self.engine.weights_version

    async def load_shared_weights(self, shared: SharedWeights) -> int:
        """Load a version the learner shares by CUDA IPC from this sampler's GPU (between batches); returns the
        weights version. The learner keeps the shared tensors until this returns."""
        self._ensure_loop_state()
        async with self.engine_lock:
            await asyncio.to_thread(self.engine.load_shared, shared)
        self.events.add("weights loaded")
        return self.engine.weights_version

    async def state(self) -> dict:
        """Weights version and generation counters of this sampler."""
        return {
            "index": self.index,
            "weights_version": self.engine.weights_version,
            "env_actors": len(self.envs),
            **self.stats,
            **{f"engine_{name}": value for name, value in self.engine.stats.items()},
        }

    async def collect(self, requests: list[EpisodeRequest]) -> Trajectory | tuple[Trajectory, ...]:
        """Play one episode per request concurrently; one return value per request, in order.

        Call it through ``start_collect``, which sets ``num_returns`` to the number of requests: each
        trajectory is then its own object, stored once and owned by the caller, so it outlives this sampler.
        """
        self._ensure_loop_state()
        self.collects += 1
        try:
            if self.instruction is None:
                await asyncio.gather(*(self._started(env) for env in self.envs))
                self.instruction, self.functions = await self._instruction()
            trajectories = await asyncio.gather(*(self._play(request, request.horizon) for request in requests))
        finally:
            self.collects -= 1
            if not self.collects:  # the rollout is over: the learner's update needs the memory more
                release_free_heap()
        return trajectories[0] if len(trajectories) == 1 else tuple(trajectories)

    async def _env_call(self, ref: ray.ObjectRef):
        """Await one env actor call for at most ``sampler.env_timeout_s`` (TimeoutError beyond it)."""

        return await asyncio.wait_for(self._await(ref), self.config.env_timeout_s)

    async def _instruction(self) -> tuple[str, list[Function]]:
        """The env's instruction and, in tool format, its tool instruction and functions, from the first env actor
        that answers (a node may have taken others).

        Raises:
            RuntimeError: no env actor answered, or the env has no functions to offer in tool format.
        """
        for env in list(self.envs):
            try:
                if self.tool_chat is None:
                    return await self._env_call(env.instruction.remote()), []
                instruction = await self._env_call(env.tool_instruction.remote())
                functions = await self._env_call(env.functions.remote())
            except ENV_FAILURES as exc:
                log.warning("env actor failed; asking another", reason=failure_reason(exc))
                continue
            if not functions:
                raise RuntimeError(
                    f"env {self.env_config.name!r} offers no functions, so it cannot be played with "
                    "env.action_format=tools; set env.action_format=text"
                )
            return instruction, functions
        raise RuntimeError(f"sampler {self.index}: no env actor answered; every one of {len(self.envs)} failed")

    async def _started(self, env: ray.actor.ActorHandle) -> bool:
        """Wait until ``env`` has started; returns whether it did (a failure also surfaces on its first call)."""
        try:
            # Starting an env actor (a process, imports, env construction) is not an env step: it gets
            # its own, longer limit, so that ``env_timeout_s`` can be tight.
            await asyncio.wait_for(self._await(env.health.remote()), self.config.start_timeout_s)
        except ENV_FAILURES as exc:
            log.warning("env actor did not start", reason=failure_reason(exc))
            return False
        return True

    async def ready_envs(self) -> int:
        """Wait until every env actor has started; drop those that did not (the pool shrinks) and return
        how many this sampler has. Then the cluster's free resources are what the running actors left."""
        self._ensure_loop_state()
        waiting = [env for env in self.envs if env not in self.ready]
        for env, ok in zip(waiting, await asyncio.gather(*(self._started(env) for env in waiting)), strict=True):
            if ok:
                self.ready.add(env)
            elif env in self.envs:  # an episode may have replaced it meanwhile
                ray.kill(env, no_restart=True)
                self._drop_env(env)
        return len(self.envs)

    def _drop_env(self, env: ray.actor.ActorHandle) -> None:
        """Take ``env`` out of the pool, and out of the free queue if it waits there."""
        self.envs.remove(env)
        self.ready.discard(env)
        self.stats["env_dropped"] += 1
        waiting = []
        while not self.free_envs.empty():
            waiting.append(self.free_envs.get_nowait())
        for other in waiting:
            if other is not env:
                self.free_envs.put_nowait(other)
        if not self.envs:
            self.free_envs.put_nowait(None)  # wakes the episodes waiting for an env: there is none left

    async def add_envs(self, count: int) -> int:
        """Start ``count`` more env actors (the pool grows into new room); returns how many this sampler has.

        An actor that has not started within ``sampler.start_timeout_s`` is killed and not added.
        """
        self._ensure_loop_state()
        fresh = [start_env_actor(self.env_config, self.config) for _ in range(count)]
        for env, ok in zip(fresh, await asyncio.gather(*(self._started(env) for env in fresh)), strict=True):
            if ok:
                self.envs.append(env)
                self.ready.add(env)
                self.free_envs.put_nowait(env)
                self.stats["env_added"] += 1
            else:
                ray.kill(env, no_restart=True)
        return len(self.envs)

    @staticmethod
    async def _await(ref: ray.ObjectRef):
        return await ref

    async def _replace_env(self, env: ray.actor.ActorHandle) -> ray.actor.ActorHandle | None:
        """Kill ``env`` (it may be hung, not dead) and start a fresh actor in its place if some node has
        room for one; otherwise drop it (the pool shrinks) and return None."""
        ray.kill(env, no_restart=True)
        if env not in self.envs:  # ``ready_envs`` dropped it already: it never started
            return None
        if not has_room(env_request(self.config)):
            self._drop_env(env)
            log.warning("no room for a new env actor; the pool shrinks", sampler=self.index, env_actors=len(self.envs))
            return None
        fresh = start_env_actor(self.env_config, self.config)
        self.envs[self.envs.index(env)] = fresh
        self.ready.discard(env)
        self.stats["env_replacements"] += 1
        if await self._started(fresh):
            self.ready.add(fresh)
        return fresh

    async def _take_env(self) -> ray.actor.ActorHandle | None:
        """A free env actor, or None when this sampler has none left."""
        while True:
            env = await self.free_envs.get()
            if env is not None:
                return env
            if not self.envs:
                self.free_envs.put_nowait(None)  # pass the news on to the next waiting episode
                return None
            # add_envs has restocked the pool since the last env was dropped: the marker is stale.

    async def _play(self, request: EpisodeRequest, horizon: int) -> Trajectory:
        """Play ``request``; an env failure moves it to a fresh env actor once, then records it as failed."""
        reasons = []
        for _ in range(2):
            env = await self._take_env()
            if env is None:
                reasons.append(f"sampler {self.index} has no env actor left")
                break
            try:
                return await self._play_on(env, request, horizon)
            except ENV_FAILURES as exc:
                reasons.append(failure_reason(exc))
                log.warning("env actor failed; replacing it", task_id=request.task_id, reason=reasons[-1])
                env = await self._replace_env(env)
            finally:
                if env is not None:
                    self.free_envs.put_nowait(env)
        return Trajectory.failure(
            env=self.env_config.name,
            task_id=request.task_id,
            group=request.group,
            horizon=horizon,
            reason="; ".join(reasons),
        )

    async def _play_on(self, env: ray.actor.ActorHandle, request: EpisodeRequest, horizon: int) -> Trajectory:
        key = next(self.episode_keys)
        try:
            return await self._run_episode(env, request, horizon, key)
        finally:
            self.engine.release(key)

    async def _run_episode(
        self, env: ray.actor.ActorHandle, request: EpisodeRequest, horizon: int, key: int
    ) -> Trajectory:
        return await run_episode(
            env_name=self.env_config.name,
            instruction=self.instruction,
            reset=lambda task_id: self._env_call(env.reset.remote(task_id)),
            step=lambda text: self._env_call(env.step.remote(text)),
            generate=(
                functools.partial(self._oracle_generate, env)
                if self.config.policy == "oracle"
                else functools.partial(self._generate, generator=torch.Generator().manual_seed(request.seed), key=key)
            ),
            chat=self.chat,
            task_id=request.task_id,
            group=request.group,
            horizon=horizon,
            max_new_tokens=self.config.sampling.max_new_tokens,
            max_context_tokens=self.config.max_context_tokens,
            tools=(
                None
                if self.tool_chat is None
                else ToolActions(
                    chat=self.tool_chat,
                    functions=self.functions,
                    step_call=lambda call: self._env_call(env.step_call.remote(call)),
                )
            ),
        )

    async def _generate(self, prompt: list[int], generator: torch.Generator, key: int) -> tuple[Generation, int]:
        future = asyncio.get_running_loop().create_future()
        self.pending.append((prompt, generator, key, future))
        self.wake.set()
        return await future

    async def _oracle_generate(self, env: ray.actor.ActorHandle, prompt: list[int]) -> tuple[Generation, int]:
        """The env oracle's reply as if sampled (in tool format, its call as the format writes it): its ids end with
        the end-of-turn token."""
        if self.tool_chat is None:
            reply = await self._env_call(env.oracle_reply.remote())
        else:
            reply = self.tool_chat.format.call_text(None, [await self._env_call(env.oracle_call.remote())])
        ids = [*self.chat.encode(reply), self.eos_token_id]
        return Generation(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop"), self.engine.weights_version

    def _active_episodes(self) -> int:
        return len(self.envs) - self.free_envs.qsize()

    async def _batch_loop(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            deadline = time.monotonic() + BATCH_WINDOW_S
            while len(self.pending) < min(self._active_episodes(), self.config.max_batch_size):
                if time.monotonic() >= deadline:
                    break
                await asyncio.sleep(0.001)
            batch = self.pending[: self.config.max_batch_size]
            del self.pending[: len(batch)]
            if not batch:
                continue
            prompts = [prompt for prompt, _, _, _ in batch]
            generators = [generator for _, generator, _, _ in batch]
            keys = [key for _, _, key, _ in batch]
            started = time.perf_counter()
            try:
                async with self.engine_lock:
                    results = await asyncio.to_thread(
                        self.engine.generate, prompts, self.config.sampling, generators, keys
                    )
                    version = self.engine.weights_version
            except Exception as exc:  # noqa: BLE001 -- hand the failure to every waiting episode instead of hanging them
                for *_, future in batch:
                    future.set_exception(exc)
                continue
            self.stats["generate_calls"] += 1
            self.stats["generate_s"] += time.perf_counter() - started
            self.stats["generated_tokens"] += sum(len(r.token_ids) for r in results)
            for (*_, future), result in zip(batch, results, strict=True):
                future.set_result((result, version))
            if self.pending:
                self.wake.set()


def start_collect(sampler: ray.actor.ActorHandle, requests: list[EpisodeRequest]) -> list[ray.ObjectRef]:
    """Start ``sampler.collect(requests)``; returns one ref per request, in order. Every episode a run plays
    is stored this way: once, as a return value of the call, owned by the caller."""
    refs = sampler.collect.options(num_returns=len(requests)).remote(requests)
    return [refs] if len(requests) == 1 else list(refs)

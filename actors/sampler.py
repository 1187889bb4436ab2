"""``SamplerActor``: plays many episodes at once, each turn generated the moment it is ready.

Each episode is a coroutine (``actors.rollout.run_episode``). A turn whose prompt is ready goes straight into
the engine's serving form (``Engine.serving``: for transformers a continuous batcher that admits rows between
decode steps, for vLLM its own scheduler) and comes back the moment its reply is done; nothing waits for a
batch to fill or for the longest reply of a batch. At most ``sampler.max_batch_size`` turns are in the engine
at once; the rest wait their turn. Weight loads, sleep and wake let the turns in flight finish, then run with
none in flight (``ServingEngine.exclusive``). A slow environment delays only its own episode.
An env actor that dies, exceeds ``sampler.env_timeout_s`` or whose env raises ``EnvUnavailable`` (the server
behind it failed) is killed and replaced (dropped instead when no node has room for a new one); its episode
is retried once from the start on a free actor, then returned as a ``failed`` record (never trained on). ``add_envs`` grows the env pool.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
from dataclasses import dataclass

import ray
import structlog
import torch

from agentgym_rl.actors.chat import ChatFormat
from agentgym_rl.actors.cluster import env_request, has_room, start_env_actor
from agentgym_rl.actors.engines import CompletionRequest, Generation, SamplingParams, make_engine
from agentgym_rl.actors.engines.serving import SEED_BOUND
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


@dataclass(frozen=True)
class EnvSlot:
    """One env instance: slot ``slot`` of env actor ``actor`` (an actor holds ``sampler.envs_per_actor`` of them)."""

    actor: ray.actor.ActorHandle
    slot: int


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
        lora_rank: a LoRA run's adapter rank (``learner.lora.r``); None: the run publishes full weights.
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
        lora_rank: int | None = None,
    ) -> None:
        hide_unreserved_gpus()
        set_torch_threads(sampler.num_threads)
        return_large_frees_to_the_os()
        self.events = Timeline()
        self.events.add("starting")  # before the engine loads (colocated: after the learner is ready)
        self.index = index
        self.config = sampler
        self.env_config = env
        # The env actors start first: their processes boot while this one loads the tokenizer and the model.
        count = sampler.envs_per_sampler if env_actors is None else env_actors
        self.envs = [start_env_actor(env, sampler) for _ in range(count)]
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
            lora_rank=lora_rank,
            vllm=sampler.vllm,
            modelled=sampler.modelled,
        )
        # Each episode attempt gets its own key: the engine keeps its keys/values between turns.
        self.episode_keys = itertools.count()
        self.ready: set[ray.actor.ActorHandle] = set()  # env actors known to have started
        self.instruction: str | None = None
        self.functions: list[Function] = []
        self.free_envs: asyncio.Queue | None = None  # of EnvSlot (and None: "no env actor left")
        # Every turn is a request to the engine's serving form; nothing else bounds them but max_batch_size.
        self.turns = self.engine.serving(
            max_rows=sampler.max_batch_size,
            max_kv_tokens=sampler.max_batch_size * sampler.max_context_tokens,
            max_requests=2**31,
        )
        self.params = SamplingParams.from_config(sampler.sampling)
        self.rows: asyncio.Semaphore | None = None  # turns in the engine at once, at most max_batch_size
        self.in_flight = 0
        self.collects = 0  # collect calls in flight
        self.stats = {
            "turns": 0,
            "generated_tokens": 0,
            "peak_turns_in_flight": 0,
            "env_replacements": 0,
            "env_dropped": 0,
            "env_added": 0,
        }

    def _ensure_loop_state(self) -> None:
        # asyncio objects must be created on the actor's event loop, which __init__ does not run on.
        if self.rows is None:
            self.rows = asyncio.Semaphore(self.config.max_batch_size)
            self.free_envs = asyncio.Queue()
            for handle in self.envs:
                self._free_slots(handle)

    async def load_weights(self, payload_ref: list[ray.ObjectRef]) -> int:
        """Load the weights behind ``payload_ref[0]`` (wrapped in a list so Ray passes the reference)."""
        self._ensure_loop_state()
        payload: WeightsPayload = await payload_ref[0]
        await self.turns.load_weights(payload)
        self.events.add("weights loaded")
        return self.engine.weights_version

    async def sleep(self) -> None:
        """Let the engine give back its device memory until ``wake`` (colocated mode, while the learner trains)."""
        self._ensure_loop_state()
        await self.turns.exclusive(self.engine.sleep)
        self.events.add("asleep")

    async def wake(self) -> None:
        self._ensure_loop_state()
        await self.turns.exclusive(self.engine.wake)
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
        """Receive the version the learner broadcasts now (once no turn is in flight); returns the weights version."""
        self._ensure_loop_state()
        await self.turns.exclusive(self.engine.receive_weights)
        self.events.add("weights loaded")
        return self.engine.weights_version

    async def load_shared_weights(self, shared: SharedWeights) -> int:
        """Load a version the learner shares by CUDA IPC from this sampler's GPU (once no turn is in flight); returns the
        weights version. The learner keeps the shared tensors until this returns."""
        self._ensure_loop_state()
        await self.turns.exclusive(functools.partial(self.engine.load_shared, shared))
        self.events.add("weights loaded")
        return self.engine.weights_version

    async def state(self) -> dict:
        """Weights version and generation counters of this sampler: its own (``turns`` generated,
        ``peak_turns_in_flight``), its engine's (``engine_*``: prompt ids prefilled and reused) and its serving
        form's (``batcher_*``: decode steps, rows admitted while others decoded, the most rows at once)."""
        return {
            "index": self.index,
            "weights_version": self.engine.weights_version,
            "env_actors": len(self.envs),
            "env_slots": len(self.envs) * self.config.envs_per_actor,
            **self.stats,
            **{f"engine_{name}": value for name, value in self.engine.stats.items()},
            **{f"batcher_{name}": value for name, value in self.turns.stats.items()},
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
            if other is None or other.actor is not env:
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
                self._free_slots(env)
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

    def _free_slots(self, env: ray.actor.ActorHandle) -> None:
        """Put every slot of env actor ``env`` in the free queue."""
        for slot in range(self.config.envs_per_actor):
            self.free_envs.put_nowait(EnvSlot(env, slot))

    async def _take_env(self) -> EnvSlot | None:
        """A free env slot, or None when this sampler has no env actor left."""
        while True:
            env = await self.free_envs.get()
            if env is not None and env.actor in self.envs:
                return env
            if env is not None:  # a slot of an actor replaced or dropped since (its other slots were in use)
                continue
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
                fresh = await self._replace_env(env.actor)
                env = None
                if fresh is not None:  # every slot of the new actor; the old one's are skipped when taken
                    self._free_slots(fresh)
            finally:
                if env is not None and env.actor in self.envs:
                    self.free_envs.put_nowait(env)
        return Trajectory.failure(
            env=self.env_config.name,
            task_id=request.task_id,
            group=request.group,
            horizon=horizon,
            reason="; ".join(reasons),
        )

    async def _play_on(self, env: EnvSlot, request: EpisodeRequest, horizon: int) -> Trajectory:
        key = next(self.episode_keys)
        try:
            return await self._run_episode(env, request, horizon, key)
        finally:
            self.engine.release(key)

    async def _run_episode(self, env: EnvSlot, request: EpisodeRequest, horizon: int, key: int) -> Trajectory:
        actor, slot = env.actor, env.slot
        return await run_episode(
            env_name=self.env_config.name,
            instruction=self.instruction,
            reset=lambda task_id: self._env_call(actor.reset.remote(task_id, slot)),
            step=lambda text: self._env_call(actor.step.remote(text, slot)),
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
                    step_call=lambda call: self._env_call(actor.step_call.remote(call, slot)),
                )
            ),
        )

    async def _generate(self, prompt: list[int], generator: torch.Generator, key: int) -> tuple[Generation, int]:
        """One turn: into the engine as soon as a row is free, back as soon as its reply is done. Its seed is the
        next draw of the episode's own stream, so the episode samples the same tokens whatever else is decoding."""
        seed = int(torch.randint(0, SEED_BOUND, (1,), generator=generator))
        request = CompletionRequest(prompt_ids=prompt, params=self.params, seed=seed, key=key, stream=False)
        async with self.rows:
            self.in_flight += 1
            self.stats["peak_turns_in_flight"] = max(self.stats["peak_turns_in_flight"], self.in_flight)
            try:
                generation, version = await self.turns.generate(request)
            finally:
                self.in_flight -= 1
        self.stats["turns"] += 1
        self.stats["generated_tokens"] += len(generation.token_ids)
        return generation, version

    async def _oracle_generate(self, env: EnvSlot, prompt: list[int]) -> tuple[Generation, int]:
        """The env oracle's reply as if sampled (in tool format, its call as the format writes it): its ids end with
        the end-of-turn token."""
        if self.tool_chat is None:
            reply = await self._env_call(env.actor.oracle_reply.remote(env.slot))
        else:
            call = await self._env_call(env.actor.oracle_call.remote(env.slot))
            reply = self.tool_chat.format.call_text(None, [call])
        ids = [*self.chat.encode(reply), self.eos_token_id]
        return Generation(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop"), self.engine.weights_version


def start_collect(sampler: ray.actor.ActorHandle, requests: list[EpisodeRequest]) -> list[ray.ObjectRef]:
    """Start ``sampler.collect(requests)``; returns one ref per request, in order. Every episode a run plays
    is stored this way: once, as a return value of the call, owned by the caller."""
    refs = sampler.collect.options(num_returns=len(requests)).remote(requests)
    return [refs] if len(requests) == 1 else list(refs)

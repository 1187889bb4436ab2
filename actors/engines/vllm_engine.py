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
  (:class:`~actors.engines.vllm_worker.WeightLoader`), then the prefix cache is reset; no restart.

vLLM's engine is asynchronous; this class runs it on an event loop in a thread of its own so that
``generate`` keeps the synchronous signature the samplers call from a worker thread.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Coroutine, Hashable
from typing import Any

import torch

from actors.engines.base import Engine, EngineUnavailableError, Generation
from actors.models import model_dir
from actors.weights import WeightsPayload, unpack_state_dict
from configs.schema import SamplingConfig

WORKER_EXTENSION = "actors.engines.vllm_worker.WeightLoader"
# collective_rpc messages are serialised; weights travel in chunks of about this many bytes.
WEIGHT_CHUNK_BYTES = 256 * 1024 * 1024
SEED_BOUND = 2**31 - 1


def _import_vllm() -> dict[str, Any]:
    """vLLM's classes, or an :class:`EngineUnavailableError` that says what is missing."""
    try:
        from vllm import AsyncEngineArgs, SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind
        from vllm.v1.engine.async_llm import AsyncLLM
    except ImportError as exc:
        raise EngineUnavailableError(
            f"sampler.engine='vllm' needs the vllm package ({exc}); install it on a CUDA machine with "
            "pip install 'agentgym-rl[vllm]', or use sampler.engine='transformers'"
        ) from exc
    if not torch.cuda.is_available():
        raise EngineUnavailableError(
            "sampler.engine='vllm' needs a CUDA GPU and none is visible to this process; run the sampler on a "
            "GPU node (sampler resources) or use sampler.engine='transformers'"
        )
    return {
        "AsyncEngineArgs": AsyncEngineArgs,
        "SamplingParams": SamplingParams,
        "TokensPrompt": TokensPrompt,
        "RequestOutputKind": RequestOutputKind,
        "AsyncLLM": AsyncLLM,
    }


class VLLMEngine(Engine):
    """Engine over vLLM's ``AsyncLLM``.

    Args:
        model_name: built-in name or local Hugging Face directory.
        dtype: ``float32`` or ``bfloat16``.
        seed: seeds the stream that per-request seeds are drawn from when no generators are given.
        stop_token_ids: ids that end a turn.
        gpu_memory_utilization: share of the GPU vLLM may take (weights + KV cache).

    Raises:
        EngineUnavailableError: vllm is not installed or no CUDA GPU is visible.
    """

    def __init__(
        self,
        *,
        model_name: str,
        dtype: str,
        seed: int,
        stop_token_ids: list[int],
        gpu_memory_utilization: float = 0.5,
    ) -> None:
        self._vllm = _import_vllm()
        self.stop_token_ids = sorted(set(stop_token_ids))
        self.generator = torch.Generator().manual_seed(seed)
        self.weights_version = 0
        self.stats = {"prefill_tokens": 0, "reused_tokens": 0}
        self._request_ids = itertools.count()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-engine-loop", daemon=True)
        self._thread.start()
        args = self._vllm["AsyncEngineArgs"](
            model=str(model_dir(model_name)),
            dtype=dtype,
            seed=seed,
            enable_prefix_caching=True,
            gpu_memory_utilization=gpu_memory_utilization,
            logprobs_mode="processed_logprobs",
            worker_extension_cls=WORKER_EXTENSION,
        )
        self._llm = self._run(self._start(args))

    def _run(self, coroutine: Coroutine) -> Any:
        """Run ``coroutine`` on the engine's loop and wait for its result (from any other thread)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

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
        params = self._vllm["SamplingParams"](
            n=1,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else -1,
            max_tokens=sampling.max_new_tokens,
            seed=seed,
            stop=list(sampling.stop),
            include_stop_str_in_output=True,
            stop_token_ids=self.stop_token_ids,
            logprobs=0,
            output_kind=self._vllm["RequestOutputKind"].FINAL_ONLY,
        )
        request = self._vllm["TokensPrompt"](prompt_token_ids=prompt)
        final = None
        async for output in self._llm.generate(request, params, request_id=f"agentgym-{next(self._request_ids)}"):
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

    def load_weights(self, payload: WeightsPayload) -> None:
        self._run(self._load(unpack_state_dict(payload)))
        self.weights_version = payload.version

    async def _load(self, tensors: dict[str, torch.Tensor]) -> None:
        chunk: list[tuple[str, torch.Tensor]] = []
        size = 0
        for name, tensor in tensors.items():
            chunk.append((name, tensor))
            size += tensor.numel() * tensor.element_size()
            if size >= WEIGHT_CHUNK_BYTES:
                await self._llm.collective_rpc("load_named_tensors", args=(chunk,))
                chunk, size = [], 0
        if chunk:
            await self._llm.collective_rpc("load_named_tensors", args=(chunk,))
        # Cached prefixes hold keys/values computed with the old weights.
        await self._llm.reset_prefix_cache()

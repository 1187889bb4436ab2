"""Generation engines behind one interface, looked up by name; and their serving form (continuous
batching, token streaming) for the HTTP endpoint."""

from __future__ import annotations

from agentgym_rl.actors.engines.base import Engine, EngineUnavailableError, Generation
from agentgym_rl.actors.engines.sampling import SamplingParams
from agentgym_rl.actors.engines.serving import (
    ChoiceDelta,
    CompletionRequest,
    CompletionStream,
    QueueFullError,
    ServingEngine,
)
from agentgym_rl.actors.models import resolve_dtype
from agentgym_rl.configs.schema import VLLMConfig

ENGINES = ("transformers", "vllm")


def make_engine(
    name: str,
    *,
    model_name: str,
    dtype: str,
    seed: int,
    stop_token_ids: list[int],
    pad_token_id: int,
    max_cached_tokens: int = 0,
    adapter: str | None = None,
    vllm: VLLMConfig | None = None,
    fit_cache_to_memory: bool = False,
) -> Engine:
    """Create the engine ``name`` (one of ``ENGINES``).

    Args:
        name: ``transformers`` or ``vllm``.
        model_name: built-in model name or local Hugging Face directory.
        dtype: ``float32``, ``bfloat16`` or ``auto`` (bfloat16 where the hardware computes in it natively).
        seed: seeds the engine's own sampling stream.
        stop_token_ids: ids that end a turn.
        pad_token_id: padding id (transformers engine).
        max_cached_tokens: transformers engine: keys/values kept between an episode's turns (0: none);
            vLLM keeps its own prefix cache.
        adapter: a LoRA adapter directory (base ``model_name``) applied before the first generation.
        vllm: the vLLM engine's settings (parallelism, memory share, longest sequence); None: the defaults.
        fit_cache_to_memory: transformers engine on a GPU: keep at most the key/value positions that half the
            memory free after the model loads holds.

    Raises:
        ValueError: ``name`` is not a known engine.
        EngineUnavailableError: the engine cannot run here (vLLM without the package or a CUDA GPU).
    """
    dtype = resolve_dtype(dtype)
    if name == "transformers":
        from agentgym_rl.actors.engines.transformers_engine import TransformersEngine

        return TransformersEngine(
            model_name=model_name,
            dtype=dtype,
            seed=seed,
            stop_token_ids=stop_token_ids,
            pad_token_id=pad_token_id,
            max_cached_tokens=max_cached_tokens,
            adapter=adapter,
            fit_cache_to_memory=fit_cache_to_memory,
        )
    if name == "vllm":
        from agentgym_rl.actors.engines.vllm_engine import VLLMEngine

        return VLLMEngine(
            model_name=model_name,
            dtype=dtype,
            seed=seed,
            stop_token_ids=stop_token_ids,
            adapter=adapter,
            **(vllm or VLLMConfig()).model_dump(),
        )
    raise ValueError(f"unknown engine {name!r}; available engines: {', '.join(ENGINES)}")


def make_serving_engine(
    name: str,
    *,
    model_name: str,
    dtype: str,
    seed: int,
    stop_token_ids: list[int],
    pad_token_id: int,
    max_rows: int,
    max_kv_tokens: int,
    max_requests: int,
    adapter: str | None = None,
    vllm: VLLMConfig | None = None,
) -> ServingEngine:
    """Create the serving form of engine ``name`` (one of ``ENGINES``).

    Args:
        name: ``transformers`` (continuous batching over the sampler's decode step) or ``vllm``
            (vLLM's own asynchronous engine).
        model_name, dtype, seed, stop_token_ids, pad_token_id, adapter, vllm: as for :func:`make_engine`.
        max_rows: most completions decoding at once.
        max_kv_tokens: transformers: bound on the running batch's key/value positions; vLLM sizes its
            paged cache from the GPU memory it is given.
        max_requests: requests in flight (decoding or waiting) beyond which new ones are refused.

    Raises:
        ValueError: ``name`` is not a known engine.
        EngineUnavailableError: the engine cannot run here (vLLM without the package or a CUDA GPU).
    """
    if name == "transformers":
        from agentgym_rl.actors.engines.continuous import ContinuousBatcher

        engine = make_engine(
            name,
            model_name=model_name,
            dtype=dtype,
            seed=seed,
            stop_token_ids=stop_token_ids,
            pad_token_id=pad_token_id,
            adapter=adapter,
        )
        return ContinuousBatcher(engine, max_rows=max_rows, max_kv_tokens=max_kv_tokens, max_requests=max_requests)
    if name == "vllm":
        from agentgym_rl.actors.engines.vllm_engine import VLLMEngine, VLLMServingEngine

        engine = VLLMEngine(
            model_name=model_name,
            dtype=resolve_dtype(dtype),
            seed=seed,
            stop_token_ids=stop_token_ids,
            max_num_seqs=max_rows,
            adapter=adapter,
            **(vllm or VLLMConfig()).model_dump(),
        )
        return VLLMServingEngine(engine, max_requests=max_requests)
    raise ValueError(f"unknown engine {name!r}; available engines: {', '.join(ENGINES)}")


__all__ = [
    "ENGINES",
    "ChoiceDelta",
    "CompletionRequest",
    "CompletionStream",
    "Engine",
    "EngineUnavailableError",
    "Generation",
    "QueueFullError",
    "SamplingParams",
    "ServingEngine",
    "make_engine",
    "make_serving_engine",
]

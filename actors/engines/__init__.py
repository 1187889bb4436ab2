"""Generation engines behind one interface, registered and looked up by name; and their serving form
(continuous batching, token streaming) for the HTTP endpoint."""

from __future__ import annotations

from agentgym_rl.actors.engines.base import (
    Engine,
    EngineSpec,
    EngineUnavailableError,
    Generation,
    UnknownEngineError,
)
from agentgym_rl.actors.engines.registry import engine_class, engine_names, register_engine
from agentgym_rl.actors.engines.sampling import SamplingParams
from agentgym_rl.actors.engines.serving import (
    ChoiceDelta,
    CompletionRequest,
    CompletionStream,
    QueueFullError,
    ServingEngine,
)
from agentgym_rl.actors.model_store import resolve_dtype
from agentgym_rl.configs.schema import ModelledEngineConfig, VLLMConfig


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
    lora_rank: int | None = None,
    vllm: VLLMConfig | None = None,
    modelled: ModelledEngineConfig | None = None,
    fit_cache_to_memory: bool = False,
) -> Engine:
    """Create engine ``name`` (a registered name, see ``engine_names``, or ``package.module:Class``).

    Args:
        name: ``transformers``, ``vllm``, a name given to ``register_engine`` or an engine's import path.
        model_name: built-in model name or local Hugging Face directory.
        dtype: ``float32``, ``bfloat16`` or ``auto`` (bfloat16 where the hardware computes in it natively).
        seed: seeds the engine's own sampling stream.
        stop_token_ids: ids that end a turn.
        pad_token_id: padding id (transformers engine).
        max_cached_tokens: transformers engine: keys/values kept between an episode's turns (0: none);
            vLLM keeps its own prefix cache.
        adapter: a LoRA adapter directory (base ``model_name``) applied before the first generation.
        lora_rank: a LoRA run's adapter rank (``learner.lora.r``): versions arrive as adapters; None: full weights.
        vllm: the vLLM engine's settings (parallelism, memory share, longest sequence); None: the defaults.
        modelled: the modelled engine's settings (reply lengths, modelled GPU time); None: the defaults.
        fit_cache_to_memory: transformers engine on a GPU: keep at most the key/value positions that half the
            memory free after the model loads holds.

    Raises:
        UnknownEngineError: ``name`` is not a known engine.
        EngineUnavailableError: the engine cannot run here (vLLM without the package or a CUDA GPU).
    """
    spec = EngineSpec(
        model_name=model_name,
        dtype=resolve_dtype(dtype),
        seed=seed,
        stop_token_ids=stop_token_ids,
        pad_token_id=pad_token_id,
        max_cached_tokens=max_cached_tokens,
        adapter=adapter,
        lora_rank=lora_rank,
        vllm=vllm or VLLMConfig(),
        modelled=modelled or ModelledEngineConfig(),
        fit_cache_to_memory=fit_cache_to_memory,
    )
    return engine_class(name).build(spec)


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
    max_cached_tokens: int = 0,
    lora_rank: int | None = None,
) -> ServingEngine:
    """Create the serving form of engine ``name`` (``Engine.build_serving``): for ``transformers`` continuous
    batching over the sampler's decode step, for ``vllm`` vLLM's own asynchronous engine.

    Args:
        name, model_name, dtype, seed, stop_token_ids, pad_token_id, adapter, lora_rank, vllm: as for
            :func:`make_engine`.
        max_rows: most completions decoding at once.
        max_kv_tokens: transformers: bound on the running batch's key/value positions; vLLM sizes its
            paged cache from the GPU memory it is given.
        max_requests: requests in flight (decoding or waiting) beyond which new ones are refused.
        max_cached_tokens: transformers: key/value positions kept between the calls of a keyed request's episode
            (its prefix cache; 0: none).

    Raises:
        UnknownEngineError: ``name`` is not a known engine.
        EngineUnavailableError: the engine cannot run here (vLLM without the package or a CUDA GPU), or has no
            serving form.
    """
    spec = EngineSpec(
        model_name=model_name,
        dtype=resolve_dtype(dtype),
        seed=seed,
        stop_token_ids=stop_token_ids,
        pad_token_id=pad_token_id,
        adapter=adapter,
        lora_rank=lora_rank,
        vllm=vllm or VLLMConfig(),
        max_cached_tokens=max_cached_tokens,
    )
    return engine_class(name).build_serving(
        spec, max_rows=max_rows, max_kv_tokens=max_kv_tokens, max_requests=max_requests
    )


__all__ = [
    "ChoiceDelta",
    "CompletionRequest",
    "CompletionStream",
    "Engine",
    "EngineSpec",
    "EngineUnavailableError",
    "Generation",
    "QueueFullError",
    "SamplingParams",
    "ServingEngine",
    "UnknownEngineError",
    "engine_class",
    "engine_names",
    "make_engine",
    "make_serving_engine",
    "register_engine",
]

"""The engine most actor tests play with."""

from __future__ import annotations

from agentgym_rl.actors.engines import Engine, EngineSpec, engine_class


def tiny_engine(
    tokenizer,
    name: str = "transformers",
    *,
    stop_token_ids: list[int] | None = None,
    max_cached_tokens: int = 0,
    lora_rank: int | None = None,
) -> Engine:
    """Engine ``name`` on tiny-random in float32, seeded 0, ending turns at EOS unless ``stop_token_ids``; with
    ``lora_rank`` for a LoRA run's adapters of that rank (see ``EngineSpec``)."""
    spec = EngineSpec(
        model_name="tiny-random",
        dtype="float32",
        seed=0,
        stop_token_ids=stop_token_ids or [tokenizer.eos_token_id],
        pad_token_id=tokenizer.pad_token_id,
        max_cached_tokens=max_cached_tokens,
        lora_rank=lora_rank,
    )
    return engine_class(name).build(spec)

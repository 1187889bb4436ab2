"""LoRA adapters (via ``peft``) on the policy, and the merged weights samplers and checkpoints need."""

from __future__ import annotations

import torch

from agentgym_rl.actors.lora import Adapter, AdapterError
from agentgym_rl.configs.schema import LoraConfig


def apply_lora(model: torch.nn.Module, config: LoraConfig) -> torch.nn.Module:
    """Wrap ``model`` so that only LoRA adapters on ``config.target_modules`` train."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    return get_peft_model(
        model,
        PeftLoraConfig(
            r=config.r,
            lora_alpha=config.alpha,
            lora_dropout=config.dropout,
            target_modules=config.target_modules,
            task_type="CAUSAL_LM",
        ),
    )


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
                merged[key] = merged[key] + module.get_delta_weight(adapter).detach().to(merged[key].dtype)
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

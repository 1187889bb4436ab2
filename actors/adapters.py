"""LoRA adapters as files and as published weights, and their application to a base model that stays exact.

An adapter directory is what ``peft``'s ``save_pretrained`` writes (``adapter_config.json`` and
``adapter_model.safetensors``, so peft and vLLM load it as they are), plus ``base_model.json``: the base
model's name (a built-in or a directory) and the SHA-256 of its weight files, checked before the adapter
is used. Tensors keep peft's names (``base_model.model.<module>.lora_A.weight``, ``(r, in)``, and
``...lora_B.weight``, ``(out, r)``); the weight update of ``<module>`` is ``scale * B @ A``,
``scale = alpha / r``.

Samplers and servers hold the base weights they loaded and, for each published version, set every adapted
weight to ``base + scale * B @ A`` computed from that same base: versions never accumulate rounding. The bases
stay in host memory, so a GPU holds each adapted weight once (merged) and nothing of it while its engine sleeps.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from agentgym_rl.actors.model_store import load_model, model_dir
from agentgym_rl.configs.errors import AgentGymError

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
BASE_MODEL = "base_model.json"
# peft's key layout around each adapted module's name
_PREFIX = "base_model.model."
_A, _B = ".lora_A.weight", ".lora_B.weight"


class AdapterError(AgentGymError, ValueError):
    """An adapter directory that is incomplete, or whose base model is not the one it was trained on."""


def is_adapter_dir(path: str | Path) -> bool:
    return (Path(path) / ADAPTER_CONFIG).is_file()


def is_policy_dir(path: str | Path) -> bool:
    """A Hugging Face model directory or a LoRA adapter directory (what a checkpoint's ``policy/`` holds)."""
    return (Path(path) / "config.json").is_file() or is_adapter_dir(path)


def policy_source(folder: str | Path) -> tuple[str, str | None]:
    """``(model.name, model.adapter)`` that load the policy in ``folder``: an adapter directory's recorded base
    and the directory itself, or a model directory and no adapter."""
    if is_adapter_dir(folder):
        try:
            base = json.loads((Path(folder) / BASE_MODEL).read_text())["name"]
        except (OSError, ValueError, KeyError) as exc:
            raise AdapterError(f"{folder}: the adapter's {BASE_MODEL} is missing or unreadable ({exc})") from None
        return base, str(folder)
    return str(folder), None


@functools.cache
def _files_sha256(files: tuple[tuple[str, int, int], ...]) -> str:
    digest = hashlib.sha256()
    for path, _, _ in files:
        digest.update(Path(path).name.encode())
        with open(path, "rb") as handle:
            while chunk := handle.read(1 << 24):
                digest.update(chunk)
    return digest.hexdigest()


def base_model_sha256(name: str) -> str:
    """SHA-256 over the weight files of model ``name`` (sorted by name; cached per file size and mtime)."""
    folder = model_dir(name)
    weights = sorted(p for p in folder.iterdir() if p.suffix in (".safetensors", ".bin") and p.is_file())
    if not weights:
        raise AdapterError(f"model {name!r} ({folder}) has no .safetensors or .bin weight files to hash")
    return _files_sha256(tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in weights))


@dataclass(frozen=True)
class Adapter:
    """A LoRA adapter: its hyperparameters, its base model and its tensors under peft's names."""

    base: str
    base_sha256: str
    r: int
    alpha: float
    target_modules: list[str] | str
    tensors: dict[str, torch.Tensor]

    @property
    def scale(self) -> float:
        return self.alpha / self.r

    def check_base(self, name: str) -> None:
        """Raise :class:`AdapterError` unless model ``name``'s weights hash to this adapter's base."""
        actual = base_model_sha256(name)
        if actual != self.base_sha256:
            raise AdapterError(
                f"the adapter was trained on base model {self.base!r} with weights sha256 {self.base_sha256[:16]}..., "
                f"but {name!r} hashes to {actual[:16]}...: give the base model it was trained on (model.name), or "
                "export a merged model from a checkpoint whose base you still have (agentgym-rl export)"
            )


def read_adapter(folder: str | Path) -> Adapter:
    """The adapter saved in ``folder`` (see the module docstring).

    Raises:
        AdapterError: a file is missing or unreadable.
    """
    from safetensors.torch import load_file

    folder = Path(folder)
    missing = [name for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS, BASE_MODEL) if not (folder / name).is_file()]
    if missing:
        raise AdapterError(
            f"{folder} is not a LoRA adapter directory: {', '.join(missing)} missing (a LoRA run's "
            "checkpoints/iter_N/policy holds all three)"
        )
    config = json.loads((folder / ADAPTER_CONFIG).read_text())
    base = json.loads((folder / BASE_MODEL).read_text())
    return Adapter(
        base=base["name"],
        base_sha256=base["sha256"],
        r=int(config["r"]),
        alpha=float(config["lora_alpha"]),
        target_modules=config["target_modules"],
        tensors=load_file(str(folder / ADAPTER_WEIGHTS)),
    )


def read_checked_adapter(folder: str | Path, base: str) -> Adapter:
    """The adapter in ``folder`` after checking that model ``base`` is the one it was trained on.

    Raises:
        AdapterError: a file is missing or unreadable, or ``base``'s weights are not the recorded ones.
    """
    saved = read_adapter(folder)
    saved.check_base(base)
    return saved


def write_base_model(folder: str | Path, name: str) -> None:
    """Record base model ``name`` and its weights' hash beside an adapter that peft saved in ``folder``."""
    record = {"name": name, "sha256": base_model_sha256(name)}
    (Path(folder) / BASE_MODEL).write_text(json.dumps(record, indent=2) + "\n")


def adapted_modules(tensors: dict[str, torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``{module name in the plain model: (A (r, in), B (out, r))}`` from peft-named adapter tensors."""
    pairs: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for key, a in tensors.items():
        if key.endswith(_A):
            module = key.removeprefix(_PREFIX).removesuffix(_A)
            b = tensors.get(key.removesuffix(_A) + _B)
            if b is None:
                raise AdapterError(f"adapter tensor {key} has no matching lora_B")
            pairs[module] = (a, b)
    if not pairs:
        raise AdapterError("no lora_A/lora_B tensor pairs in the adapter")
    return pairs


class AdapterMerger:
    """Applies successive adapter versions to one model, always from the base weights it first held.

    The first :meth:`apply` keeps each adapted linear layer's weight tensor as that layer's base (never
    written) and gives the layer a new weight; every later version recomputes ``base + scale * B @ A``
    (in float32, then cast to the model's dtype) from the same bases, on the layer's device.

    Bases live in host memory (a CPU model's own tensors; a GPU model's copied to pinned memory once): on a
    GPU the device holds only the merged weights, each version copies the bases over one layer at a time,
    and a model moved to the host (an engine asleep) leaves nothing of the adapters on the device.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.bases: dict[str, torch.Tensor] = {}

    def apply(self, tensors: dict[str, torch.Tensor], scale: float) -> None:
        for module_name, (a, b) in adapted_modules(tensors).items():
            try:
                layer = self.model.get_submodule(module_name)
            except AttributeError:
                raise AdapterError(f"the adapter adapts {module_name!r}, which this model does not have") from None
            base = self.bases.get(module_name)
            if base is None:
                base = self.bases[module_name] = _on_host(layer.weight.detach())
            device = layer.weight.device
            delta = (b.to(device, torch.float32) @ a.to(device, torch.float32)) * scale
            if delta.shape != base.shape:
                raise AdapterError(
                    f"adapter update of {module_name} has shape {tuple(delta.shape)}, the weight {tuple(base.shape)}"
                )
            merged = (base.to(device, non_blocking=True).float() + delta).to(base.dtype)
            layer.weight = torch.nn.Parameter(merged, requires_grad=False)


def _on_host(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` itself on the CPU, else a copy in pinned host memory (copied back at full bus speed)."""
    if weight.device.type == "cpu":
        return weight
    return torch.empty_like(weight, device="cpu", pin_memory=True).copy_(weight)


def load_policy(name: str, adapter: str | None, dtype: str = "float32") -> torch.nn.Module:
    """Model ``name`` in ``dtype`` with the adapter in directory ``adapter`` (if any) merged in, after checking
    that ``name`` is the adapter's base."""
    model = load_model(name, dtype)
    if adapter is not None:
        saved = read_checked_adapter(adapter, name)
        AdapterMerger(model).apply(saved.tensors, saved.scale)
    return model

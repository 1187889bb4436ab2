"""Versioned policy weights as they travel through the Ray object store.

The learner ``ray.put``s one :class:`WeightsPayload` per version and hands out its ObjectRef;
every sampler or server reads it by reference. Tensors are stored as numpy arrays, which Ray
deserialises zero-copy from shared memory; bfloat16 (which numpy lacks) travels as int16 bits. A LoRA run
publishes only its adapter (peft's tensor names, with ``lora_scale`` set); engines apply it to the base
weights they hold (``actors.adapters.AdapterMerger``).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class WeightsPayload:
    version: int
    arrays: dict[str, np.ndarray]
    dtypes: dict[str, str]
    # None: ``arrays`` is the whole state dict; else they are LoRA adapter tensors with this alpha / r.
    lora_scale: float | None = None

    @property
    def num_bytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())


def pack_state_dict(
    state_dict: dict[str, torch.Tensor], version: int, dtype: str | None = None, lora_scale: float | None = None
) -> WeightsPayload:
    """Copy ``state_dict`` to CPU numpy arrays tagged with ``version``, floating tensors cast to ``dtype``
    (``float32`` or ``bfloat16``; None keeps each tensor's own); ``lora_scale`` marks an adapter's tensors."""
    arrays: dict[str, np.ndarray] = {}
    dtypes: dict[str, str] = {}
    cast = getattr(torch, dtype) if dtype is not None else None
    for name, tensor in state_dict.items():
        tensor = tensor.detach()
        if cast is not None and tensor.is_floating_point():
            tensor = tensor.to(cast)  # where the tensor is: a GPU sends the host half of float32's bytes
        tensor = tensor.cpu()
        dtypes[name] = str(tensor.dtype).removeprefix("torch.")
        if tensor.dtype == torch.bfloat16:
            tensor = tensor.view(torch.int16)
        arrays[name] = tensor.numpy().copy()
    return WeightsPayload(version=version, arrays=arrays, dtypes=dtypes, lora_scale=lora_scale)


def unpack_state_dict(payload: WeightsPayload) -> dict[str, torch.Tensor]:
    """Tensors viewing the payload's arrays (no copy); ``load_state_dict`` copies them into the model."""
    tensors = {}
    with warnings.catch_warnings():
        # Arrays read from the object store are read-only, which torch warns about; nothing writes them.
        warnings.simplefilter("ignore", UserWarning)
        for name, array in payload.arrays.items():
            tensor = torch.from_numpy(array)
            if payload.dtypes[name] == "bfloat16":
                tensor = tensor.view(torch.bfloat16)
            tensors[name] = tensor
    return tensors

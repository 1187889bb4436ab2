"""Mixed precision for the learner: float32 master weights, forward and backward in bfloat16.

A bfloat16 parameter keeps 8 bits of mantissa, so an update smaller than about 1/256 of a weight is
rounded away entirely: plain bfloat16 training silently stops learning at RL's small learning rates.
Here the float32 modules stay the weights of record (the optimizer steps them; checkpoints and
published weights are read from them) and a bfloat16 copy of them runs every forward and backward.
After each backward the copy's gradients are added into the float32 ``.grad`` (so micro-batches
accumulate in float32), and after each optimizer step the master weights are rounded into the copy.
"""

from __future__ import annotations

import copy
from typing import Literal

import torch

from agentgym_rl.actors.model_store import AUTO, bfloat16_is_fast

Precision = Literal["float32", "bf16-mixed"]


def resolve_precision(precision: str, device: torch.device) -> Precision:
    """``auto`` -> ``bf16-mixed`` where bfloat16 is fast on ``device`` (a CUDA GPU that supports it; a CPU, see
    ``bfloat16_is_fast``), else ``float32``."""
    if precision == AUTO:
        if device.type == "cuda":
            return "bf16-mixed" if torch.cuda.is_bf16_supported() else "float32"
        return "bf16-mixed" if bfloat16_is_fast() else "float32"
    if precision not in ("float32", "bf16-mixed"):
        raise ValueError(f"unknown learner.precision {precision!r}; valid: auto, float32, bf16-mixed")
    return precision  # type: ignore[return-value]


class BFloat16Compute:
    """A bfloat16 copy of ``master`` for forward and backward.

    Only parameters are cast; buffers (e.g. rotary frequencies) keep their dtype, as when a model is
    loaded in bfloat16. A frozen parameter that is bfloat16 already (a LoRA run's base) is shared with
    ``master``, not copied.

    Args:
        master: modules whose trainable (float32) parameters the optimizer updates.
    """

    def __init__(self, master: torch.nn.Module) -> None:
        self.master = master
        # Each parameter's copy is made in bfloat16 directly: a deepcopy of the float32 modules, cast after,
        # would hold a second float32 model on the device for a moment.
        replacements = {
            id(param): param
            if param.dtype == torch.bfloat16 and not param.requires_grad
            else torch.nn.Parameter(param.detach().to(torch.bfloat16), requires_grad=param.requires_grad)
            for param in master.parameters()
        }
        self.module = copy.deepcopy(master, memo=replacements)
        self.pairs = [
            (low, high)
            for low, high in zip(self.module.parameters(), master.parameters(), strict=True)
            if high.requires_grad
        ]

    def collect_gradients(self) -> None:
        """Add the copy's gradients into the master's float32 ``.grad`` and clear the copy's."""
        for low, high in self.pairs:
            if low.grad is None:
                continue
            if high.grad is None:
                high.grad = low.grad.float()
            else:
                high.grad.add_(low.grad)
            low.grad = None

    @torch.no_grad()
    def copy_weights(self) -> None:
        """Round every master parameter into the copy (after an optimizer step or a load)."""
        for low, high in zip(self.module.parameters(), self.master.parameters(), strict=True):
            if low is not high:
                low.copy_(high)

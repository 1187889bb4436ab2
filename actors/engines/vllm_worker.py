"""Methods vLLM mixes into its GPU workers (``worker_extension_cls``), called through ``collective_rpc``.

This module is imported inside vLLM's worker processes; it needs nothing but torch there.
"""

from __future__ import annotations

import torch


class WeightLoader:
    """Worker extension: loads Hugging Face-named tensors into the running model, in place.

    ``self.model_runner`` and ``self.device`` belong to the vLLM worker this class is mixed into.
    """

    def load_named_tensors(self, named: list[tuple[str, torch.Tensor]]) -> int:
        """Copy ``named`` (Hugging Face parameter names, CPU tensors) into the model; returns how many.

        vLLM's ``model.load_weights`` maps Hugging Face names onto its fused layers (e.g. q/k/v into
        one ``qkv_proj``), the same way it reads a checkpoint at start-up.
        """
        self.model_runner.model.load_weights(weights=[(name, tensor.to(self.device)) for name, tensor in named])
        return len(named)

"""Methods vLLM mixes into its workers (``worker_extension_cls``), called through ``collective_rpc``.

This module is imported inside vLLM's worker processes; it needs torch, vLLM and ``actors.weight_sync`` there.
"""

from __future__ import annotations

import torch

from agentgym_rl.actors.weight_sync import GroupAddress, WeightGroup


class WeightLoader:
    """Worker extension: loads Hugging Face-named tensors into the running model, in place.

    ``self.model_runner``, ``self.device`` and ``self.vllm_config`` belong to the vLLM worker this class
    is mixed into. An update is ``begin_loading_named_tensors``, ``load_named_tensors`` per chunk, then
    ``finish_loading_named_tensors``: between the first and the last, vLLM's layer-wise reload buffers each
    layer's weights and re-runs its post-load processing once all have arrived (on CPU that repacks
    the linear layers' weights for its GEMM kernels and drops the plain ones, so a bare
    ``model.load_weights`` after start-up cannot reach them).
    """

    def begin_loading_named_tensors(self) -> None:
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        with set_current_vllm_config(self.vllm_config):
            initialize_layerwise_reload(self.model_runner.get_model())

    def load_named_tensors(self, named: list[tuple[str, str, list[int], bytes]]) -> int:
        """Load ``named`` (Hugging Face parameter names with each tensor's dtype, shape and bytes, see
        ``vllm_engine.tensor_message``) into the model; returns how many.

        vLLM's ``model.load_weights`` maps Hugging Face names onto its fused layers (e.g. q/k/v into
        one ``qkv_proj``), the same way it reads a checkpoint at start-up.
        """
        from vllm.config import set_current_vllm_config

        weights = [
            (name, tensor_from_message(dtype, shape, data).to(self.device)) for name, dtype, shape, data in named
        ]
        with set_current_vllm_config(self.vllm_config):
            self.model_runner.get_model().load_weights(weights=weights)
        return len(named)

    def join_weight_group(self, address: list, first_rank: int) -> None:
        """Join the learner's weight group (``GroupAddress`` fields, as vLLM's transport passes them) as
        ``first_rank`` plus this worker's rank."""
        self.weight_group = WeightGroup(GroupAddress(*address), first_rank + self.rank, self.device)

    def receive_broadcast_weights(self) -> tuple[int, int]:
        """Load the next version broadcast in the weight group, bucket by bucket; returns (version, bytes)."""
        from vllm.config import set_current_vllm_config

        header = self.weight_group.receive_header()
        self.begin_loading_named_tensors()
        for bucket in self.weight_group.receive_buckets(header):
            with set_current_vllm_config(self.vllm_config):
                self.model_runner.get_model().load_weights(weights=[(n, t.to(self.device)) for n, t in bucket])
        self.finish_loading_named_tensors()
        return header.version, header.num_bytes

    def finish_loading_named_tensors(self) -> None:
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        with set_current_vllm_config(self.vllm_config):
            finalize_layerwise_reload(self.model_runner.get_model(), self.model_runner.model_config)


def tensor_from_message(dtype: str, shape: list[int], data: bytes) -> torch.Tensor:
    """The tensor that ``vllm_engine.tensor_message`` sent (a copy that owns its memory)."""
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(getattr(torch, dtype)).reshape(shape)

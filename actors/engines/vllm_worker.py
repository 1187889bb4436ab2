"""Methods vLLM mixes into its workers (``worker_extension_cls``), called through ``collective_rpc``.

This module is imported inside vLLM's worker processes; it needs torch, vLLM and ``actors.weight_sync`` there.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterable

import torch

from agentgym_rl.actors.transport import device_identity, open_cuda_tensors
from agentgym_rl.actors.weight_sync import GroupAddress, WeightGroup


class WeightLoader:
    """Worker extension: receives Hugging Face-named tensors over weight groups and loads them into the running
    model, in place; in a LoRA run, adds each version's adapter by id instead (``add_adapter``).

    ``self.model_runner``, ``self.device``, ``self.rank`` and ``self.vllm_config`` belong to the vLLM worker this
    class is mixed into. A worker can be in two groups by name: the learner's (``trainer.weight_sync:
    broadcast``) and its engine's own (object-store loads, sent on by the sampler's process). A version is
    loaded between ``initialize_layerwise_reload`` and ``finalize_layerwise_reload``: vLLM's layer-wise
    reload buffers each layer's weights and re-runs its post-load processing once all have arrived (on CPU
    that repacks the linear layers' weights for its GEMM kernels and drops the plain ones, so a bare
    ``model.load_weights`` after start-up cannot reach them).
    """

    def weight_device_identity(self) -> tuple[str, str]:
        """This worker's ``DeviceIdentity`` fields (node, GPU UUID or ``cpu``)."""
        identity = device_identity(self.device)
        return identity.node, identity.device

    def join_weight_group(self, address: list, first_rank: int, name: str) -> None:
        """Join weight group ``name`` (``GroupAddress`` fields, as vLLM's transport passes them) as
        ``first_rank`` plus this worker's rank."""
        if not hasattr(self, "weight_groups"):
            self.weight_groups: dict[str, WeightGroup] = {}
        self.weight_groups[name] = WeightGroup(GroupAddress(*address), first_rank + self.rank, self.device)

    def receive_broadcast_weights(self, name: str) -> tuple[int, int]:
        """Load the next version sent in weight group ``name``, bucket by bucket; returns (version, bytes).

        vLLM's ``model.load_weights`` maps Hugging Face names onto its fused layers (e.g. q/k/v into one
        ``qkv_proj``), the same way it reads a checkpoint at start-up.
        """
        group = self.weight_groups[name]
        header = group.receive_header()
        self._reload(group.receive_buckets(header))
        return header.version, header.num_bytes

    def load_shared_weights(self, handles: bytes) -> None:
        """Load full weights shared by CUDA IPC from a process on this worker's GPU (``CudaIpcHandles``, pickled:
        vLLM's RPC transport carries bytes), copying from them on the device."""
        self._reload([list(open_cuda_tensors(pickle.loads(handles)).items())])
        torch.cuda.synchronize()  # the sender frees its tensors once this returns

    def add_adapter(self, lora_id: int, tensors: bytes, config: dict) -> None:
        """Add a LoRA adapter as vLLM's adapter ``lora_id``: ``tensors`` under peft's names, in safetensors' format
        (what ``adapter_model.safetensors`` holds; vLLM's RPC transport carries bytes), ``config`` the fields of
        its ``adapter_config.json`` (``r``, ``lora_alpha``, ``target_modules``). Requests that name ``lora_id``
        (``LoRARequest``) then compute ``W x + scale * B A x`` with vLLM's LoRA kernels; the base weights stay as
        they are.

        vLLM 0.32 reads an adapter only from a directory (``add_lora``); this builds the same ``LoRAModel`` from
        tensors and registers it with the worker's adapter manager, which then finds it by id and never reads
        the request's path. vLLM packs q/k/v and gate/up into one layer each; its manager stacks the adapters of
        the parts (peft's names) into the packed layer's slices.
        """
        from safetensors.torch import load
        from vllm.lora.lora_model import LoRAModel
        from vllm.lora.peft_helper import PEFTHelper

        workers = self.model_runner.lora_manager
        helper = PEFTHelper.from_dict(config)
        helper.validate_legal(workers.lora_config)  # e.g. a rank above the engine's max_lora_rank
        mapper = getattr(self.model_runner.get_model(), "hf_to_vllm_mapper", None)
        adapter = LoRAModel.from_lora_tensors(
            lora_id,
            load(tensors),
            helper,
            device="cpu",
            dtype=workers.lora_config.lora_dtype,
            model_vocab_size=workers.vocab_size,
            weights_mapper=None if mapper is None else mapper.get_rename_mapper(),
        )
        workers._adapter_manager.add_adapter(adapter)

    def _reload(self, buckets: Iterable[list[tuple[str, torch.Tensor]]]) -> None:
        """Load ``buckets`` of Hugging Face-named tensors into the running model, one bucket at a time."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

        model = self.model_runner.get_model()
        with set_current_vllm_config(self.vllm_config):
            initialize_layerwise_reload(model)
            for bucket in buckets:
                model.load_weights(weights=[(n, t.to(self.device)) for n, t in bucket])
            finalize_layerwise_reload(model, self.model_runner.model_config)

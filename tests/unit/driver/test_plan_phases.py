"""The memory plan's phases for the three documented set-ups on an 80 GB H100: each moment's bytes recomputed here from
the model's published config (the parameters counted on a model built from it, the activations, logits and
caches from its sizes), and `train`'s check refusing a run whose worst phase does not fit, naming the phase."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from agentgym_rl.actors.architectures import Shape, published_shape
from agentgym_rl.configs import load_config
from agentgym_rl.driver.plan import GIB, Hardware, PlanError, check_memory, make_plan

REPO = Path(__file__).resolve().parents[3]
MIB = 1 << 20
H100 = Hardware(gpu_bytes=81_559 * MIB, gpu_source="test", gpus_per_node=8)
CONTEXT = GIB // 2  # a CUDA context
GRAPHS = GIB  # vLLM's CUDA graphs, which it keeps asleep: the plan's assumption
BUCKET = 256 * MIB  # trainer.weight_sync.bucket_mb, and an object-store load's bucket


@pytest.fixture(scope="module")
def qwen():
    """Qwen2.5-7B-Instruct's published config and its parameter count, from a model built on the meta device."""
    config = published_shape("Qwen2.5-7B-Instruct")
    with torch.device("meta"):
        parameters = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    return config, parameters


def checkpointed_activations(config, tokens: int) -> int:
    """Each layer's input kept, and one layer's tensors for its backward, in bfloat16."""
    head = config.hidden_size // config.num_attention_heads
    per_layer = (
        4 * config.hidden_size
        + 2 * config.num_attention_heads * head
        + 2 * config.num_key_value_heads * head
        + 4 * config.intermediate_size
    )
    return 2 * tokens * (config.num_hidden_layers * config.hidden_size + per_layer)


def logits(config) -> int:
    """One row of 20 turns x 256 new tokens (under 8,192) projected through the vocabulary: 6 float32 tensors."""
    return 4 * 6 * (20 * 256) * config.vocab_size


def plan_moments(path: str, *overrides: str) -> list[dict[str, int]]:
    config = load_config(REPO / path, list(overrides))
    shape = Shape.from_config(published_shape("Qwen2.5-7B-Instruct"))
    plan = make_plan(config, shape, H100, model="test")
    assert plan.fits, plan.problems
    return [{moment: holder.moment_bytes(moment) for moment in holder.moments} for holder in plan.holders]


def test_one_gpu_lora_with_vllm_colocated(qwen):
    config, p = qwen
    h, i = config.hidden_size, config.intermediate_size
    kv = config.num_key_value_heads * h // config.num_attention_heads
    # LoRA r 16 on every linear layer: r (in + out) for q, k, v, o, gate, up, down
    lora = 16 * config.num_hidden_layers * ((h + h) + 2 * (h + kv) + (h + h) + 2 * (h + i) + (i + h))
    kept = 2 * p + (4 + 2) * lora + CONTEXT  # bfloat16 base, float32 adapter and its bfloat16 copy
    engine = int(0.35 * H100.gpu_bytes) + 2 * CONTEXT  # the share; the sampler's and vLLM worker's processes
    asleep = GRAPHS + 2 * CONTEXT
    backward = 8 * lora + (4 + 2) * lora + checkpointed_activations(config, 8192) + logits(config)
    [gpu] = plan_moments("configs/gpu/one_gpu.yaml")
    assert gpu == pytest.approx(
        {
            "load": kept,
            "engine start": kept + engine,
            "rollout": kept + engine,
            "update": kept + asleep + backward,
            "update end": kept + asleep + 8 * lora,
            "sync": kept + engine + BUCKET,  # the adapter goes by CUDA IPC; vLLM loads the merged base by buckets
        },
        abs=16,
    )


def zero3_learner(p: int) -> tuple[int, int]:
    """(what 8 ZeRO-3 learners each load, what each keeps): the float32 policy whole and the bfloat16 reference;
    then an eighth of the weights, masters and gradients, the reduce bucket, the reference."""
    load = 4 * p + 2 * p + CONTEXT
    kept = (2 + 4 + 2) * p // 8 + 2 * 500_000_000 + 2 * p + CONTEXT
    return load, kept


def test_one_node_8_full_weights_zero3_with_vllm_colocated(qwen):
    config, p = qwen
    load, kept = zero3_learner(p)
    engine = int(0.4 * H100.gpu_bytes) + 2 * CONTEXT
    asleep = GRAPHS + 2 * CONTEXT
    moments = 8 * p // 8  # offloaded between updates
    backward = moments + checkpointed_activations(config, 8192) + logits(config) + 2 * 10**9  # live parameters
    [gpu] = plan_moments("configs/gpu/one_node_8.yaml")
    assert gpu == pytest.approx(
        {
            "load": load,
            "engine start": kept + engine,
            "rollout": kept + engine,
            "update": kept + asleep + backward,
            "update end": kept + asleep + moments + BUCKET,  # the parameter norm gathers a bucket at a time
            "sync": kept + engine + 2 * p + BUCKET + BUCKET,  # the engine awake, the model gathered for a broadcast
        },
        abs=16,
    )
    assert max(gpu.values()) == gpu["sync"]
    assert H100.gpu_bytes - gpu["sync"] > 8 * GIB


def test_two_nodes_zero3_learners_and_vllm_samplers_apart(qwen):
    config, p = qwen
    load, kept = zero3_learner(p)
    moments = 8 * p // 8  # kept on the GPU from the first step on
    backward = checkpointed_activations(config, 8192) + logits(config) + 2 * 10**9
    engine = int(0.9 * H100.gpu_bytes) + 2 * CONTEXT
    learner, sampler = plan_moments("configs/gpu/two_nodes.yaml")
    assert learner == pytest.approx(
        {
            "load": load,
            "rollout": kept + moments,
            "update": kept + moments + backward,
            "update end": kept + moments + BUCKET,
            "sync": kept + moments + 2 * p + BUCKET,
        },
        abs=16,
    )
    assert sampler == pytest.approx(
        {"engine start": engine, "rollout": engine, "update": engine, "sync": engine + BUCKET}, abs=16
    )


def test_train_refuses_a_run_whose_sync_does_not_fit_naming_the_phase():
    # At vLLM's 0.55 share the 8+8 set-up's sync (the engine awake, the model gathered) overflows an H100.
    too_big = load_config(
        REPO / "configs/gpu/one_node_8.yaml", ["ray.gpu_memory_gib=79.65", "sampler.vllm.gpu_memory_utilization=0.55"]
    )
    with pytest.raises(PlanError, match=r"at its peak, in the sync, more than its 79\.65 GiB") as refused:
        check_memory(too_big)
    assert "ZeRO-3 weights gathered whole for a broadcast (14.19 GiB)" in str(refused.value)


def test_vllm_refuses_to_start_without_its_share_free():
    # What the 8 learners keep (22.71 GiB) and two processes' CUDA contexts leave less than 0.75 of the GPU free.
    config = load_config(REPO / "configs/gpu/one_node_8.yaml", ["sampler.vllm.gpu_memory_utilization=0.75"])
    plan = make_plan(config, Shape.from_config(published_shape("Qwen2.5-7B-Instruct")), H100, model="test")
    assert plan.problems[0] == (
        "vLLM would refuse to start on each GPU of the learner + sampler, colocated: it starts only with its share "
        "free (0.75 of 79.65 GiB = 59.74 GiB), and 23.71 GiB are held there before it; lower "
        "vllm.gpu_memory_utilization"
    )

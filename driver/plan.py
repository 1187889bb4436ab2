"""The memory plan of a run: where its actors would go and what each GPU would hold, before anything starts.

``agentgym-rl plan CONFIG`` prints it; ``train`` refuses a run whose plan does not fit (``check_fits``). Every
number is arithmetic from the model's architecture and the config, not a measurement: it says which settings
make a run too big before the run starts, and by how much.

Parameters, LoRA parameters, key/value and activation sizes come from the model's ``Shape``
(``actors.architectures``).

Below, ``P`` is the policy's parameters, ``T`` its trainable ones (``P``, or LoRA's), ``c`` the bytes of the
learner's compute dtype (2 under ``bf16-mixed``, else 4) and ``n`` the learners of a DeepSpeed group.

Learner, per learner (``learner_items``):

* torch backend: trainable weights as float32 masters (``4 T``) and under ``bf16-mixed`` their bfloat16
  compute copy (``2 T``); a LoRA run's frozen base once, in the compute dtype (``c P``); gradients ``4 T`` (+
  ``2 T`` for the compute copy's, during a backward), freed after each step; AdamW's two float32 moments
  ``8 T``, made at the first step, in host memory between updates in colocated mode.
* deepspeed backend (ZeRO, Rajbhandari et al. 2020): weights ``c T``, float32 masters ``4 T`` under
  bf16, gradients ``c T``, moments ``8 T``; stage 1 splits masters and moments over the ``n`` learners, 2 the
  gradients too, 3 the weights too. Under ZeRO-3 (DeepSpeed 0.19's defaults) the gradients are a flat
  partition made at start and kept, beside one reduce bucket of 5e8 elements; the update gathers at most 1e9
  parameters at a time (``stage3_max_live_parameters``) and, at its end, the weights for the parameter norm one
  256 MiB bucket at a time; a weight sync through the object store gathers them a bucket at a time
  (``trainer.weight_sync.bucket_mb``), a broadcast the whole model on every learner at once (``c P``,
  ``learner.actor``'s ``backend.gathered``).
* start-up: ``learner/actor.py`` (as of commit 222fe85) loads the policy whole and moves it to
  the GPU before DeepSpeed casts and partitions it: a full run's ``4 T`` float32 (a LoRA run's base in the
  compute dtype, ``c P``, and its adapter ``4 T``), a critic's in float32, beside the reference model. The
  torch backend keeps what it loads.
* reference model: none for LoRA (the policy's base with the adapter off, or the starting adapter frozen
  beside the trained one: ``4 L`` more, and its ``2 L`` compute copy under the torch backend's bf16-mixed); a
  full-weight run whose algorithm needs one holds a copy, ``c P``.
* critic (PPO): the policy's decoder and a value head, all trained, counted as above.
* activations of one micro-batch of ``B = learner.micro_batch_size`` rows of ``S`` tokens (``S`` =
  ``sampler.max_context_tokens``, or ``learner.pack_tokens`` with packing): per layer and token the
  tensors the backward keeps, ``4 h + 2 (n_q d) + 2 (n_kv d) + 4 i`` elements of ``c`` bytes (the norms'
  inputs and outputs, q, k, v, the attention output, the MLP's gate, up, activation and product); with
  gradient checkpointing each layer keeps its input (``h``) and one layer at a time the rest. The critic's
  backward holds as much again.
* logits: the forward projects only the ``N`` target tokens, ``N = B min(S, H m)`` (longest horizon ``H``,
  ``m`` = ``sampler.sampling.max_new_tokens``; packed rows: ``B S``), through the ``V`` vocabulary: ``4 N V``
  bytes per float32 (N, V) tensor, 6 of them alive at once when the loss differentiates the entropy
  (the logits, the log-softmax kept by the cross-entropy and by the entropy, its probabilities, their
  product, a gradient), else 5 (the entropy metric's three without a graph, freed before the backward).
* a weight broadcast: rank 0 packs one bucket at a time on its GPU (``trainer.weight_sync.bucket_mb``).
* a CUDA context per process on a GPU, 0.5 GiB.

Samplers (``sampler_items``): the transformers engine holds the weights in ``sampler.dtype`` (``s`` bytes),
with LoRA on a CPU the adapted layers' base weights once more (each version is merged from them; on a GPU
they wait in host memory), and keys/values of ``2 n_kv d`` elements per layer and token for the positions it
keeps between turns (``sampler.episode_cache_tokens``; unset on a GPU, at most half of what the GPU has free
after the model loads) and those of a decode batch (``min(sampler.max_batch_size, envs_per_sampler x envs_per_actor)`` rows
of ``sampler.max_context_tokens``). vLLM takes its share of each of its GPUs as vLLM (0.32, 0.33) takes it:
``gpu_memory_utilization`` times the GPU's whole memory, for weights, cache, activations and CUDA graphs, and
it refuses to start unless that much is free then; it must find the weights room in the share. Outside the
share it holds its worker process's CUDA context; asleep it gives back its weights and cache but keeps its
CUDA graphs (``VLLM_CUDA_GRAPH_BYTES``, an assumption). A weight load arrives one bucket at a time on the
engine's GPU (``trainer.weight_sync.bucket_mb``, or 256 MiB from the object store: the larger). Serve replicas
are counted alike from ``serve``.

Not counted: the engines' prefill activations (one layer at a time), DeepSpeed's transient buffers at start
(its cast, one tensor at a time; ZeRO-3's float32 gradient buffer for its optimizer's first state, ``4 T / n``,
less than the policy it replaces), the forwards without a graph (old and reference log-probabilities: one
layer at a time), a CUDA IPC copy of ZeRO-3 weights (one colocated learner alone) and the allocator's
fragmentation.

Phases. A GPU's items are held over some of six moments of a run, in four phases (``MOMENTS``, ``PHASE``):

* start-up: the learners load (``load``); then, colocated, the engines start beside what the learners keep
  (``engine start``: the samplers start once every learner is ready);
* rollout: the engines generate; colocated learners keep their weights (their moments in host memory);
* update: the learners train (a backward; then its end, which under ZeRO-3 gathers the weights for the parameter
  norm a bucket at a time); colocated engines sleep and keep on the GPU only their CUDA graphs and processes;
* sync: the engines are awake (a colocated engine wakes whole, weights and cache) and the new weights arrive;
  ZeRO-3 learners gather the whole model meanwhile for a broadcast, a bucket at a time for the object store.

A GPU's peak is its largest moment; ``check_fits`` refuses a plan whose peak does not fit, naming the phase.
``auto`` dtypes resolve to bfloat16 on a GPU (one that supports it, as every GPU since NVIDIA's Ampere does).
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from typing import Literal

import structlog

from agentgym_rl.actors.architectures import ArchitectureError, Shape, read_architecture
from agentgym_rl.actors.cluster import ClusterError, plan_actors
from agentgym_rl.actors.model_store import bfloat16_is_fast
from agentgym_rl.configs import Config
from agentgym_rl.configs.errors import AgentGymError
from agentgym_rl.configs.schema import LoraConfig
from agentgym_rl.driver.needs import run_needs
from agentgym_rl.learner.algorithms import build_algorithm

log = structlog.get_logger()

MIB = 1 << 20
GIB = 1 << 30
# What a GPU is taken to hold when neither --gpu-memory-gib, ray.gpu_memory_gib nor a visible GPU says: an 80 GB
# H100's real capacity, 81,559 MiB as nvidia-smi reports it (79.65 GiB; an 80 GB A100 has 81,920 MiB).
DEFAULT_GPU_GIB = 81_559 / 1024
DEFAULT_GPUS_PER_NODE = 8
CUDA_CONTEXT_BYTES = GIB // 2
# (N, V) float32 tensors alive at once in the loss's forward and backward, with and without the entropy's graph.
LOGIT_TENSORS = {True: 6, False: 5}
# vLLM's CUDA graphs, which its sleep keeps: an assumption (vLLM logs its estimate at start).
VLLM_CUDA_GRAPH_BYTES = GIB
# DeepSpeed ZeRO-3's defaults (0.19): the reduce bucket's and the most gathered parameters' element counts.
ZERO3_REDUCE_BUCKET = 500_000_000
ZERO3_MAX_LIVE_PARAMETERS = 1_000_000_000
# An object-store load reaches vLLM's workers in buckets of this size (actors.engines.vllm_engine).
OBJECT_STORE_BUCKET_BYTES = 256 * MIB
# ZeRO-3 learners gather their weights for the update's parameter norm in buckets of this size (learner.actor).
PARAMETER_NORM_BUCKET_BYTES = 256 * MIB

Phase = Literal["start-up", "rollout", "update", "sync"]
Moment = Literal["load", "engine start", "rollout", "update", "update end", "sync"]
MOMENTS: tuple[Moment, ...] = ("load", "engine start", "rollout", "update", "update end", "sync")
PHASE: dict[Moment, Phase] = {
    "load": "start-up",
    "engine start": "start-up",
    "rollout": "rollout",
    "update": "update",
    "update end": "update",
    "sync": "sync",
}
# How `plan` names each moment.
MOMENT_TEXT: dict[Moment, str] = {
    "load": "start-up, the learners load",
    "engine start": "start-up, the engines start",
    "rollout": "rollout",
    "update": "update, a backward",
    "update end": "update, its end",
    "sync": "sync",
}
# The moments an item is held over (see the module docstring).
ALWAYS = frozenset(MOMENTS)
STARTED = ALWAYS - {"load"}  # from the end of the learners' load on
LOADING = frozenset({"load"})
BACKWARD = frozenset({"update"})
UPDATE = frozenset({"update", "update end"})
UPDATE_END = frozenset({"update end"})  # ZeRO-3's parameter norm, gathered a bucket at a time
SYNC = frozenset({"sync"})
FROM_FIRST_STEP = frozenset({"rollout", "update", "update end", "sync"})  # AdamW's moments, kept on the GPU
AWAKE = frozenset({"engine start", "rollout", "sync"})  # a colocated engine, asleep in the update
# The moments of a GPU that holds only learners, and of one that holds only engines.
LEARNER_MOMENTS: tuple[Moment, ...] = ("load", "rollout", "update", "update end", "sync")
ENGINE_MOMENTS: tuple[Moment, ...] = ("engine start", "rollout", "update", "sync")


class PlanError(AgentGymError):
    """A run that does not fit, or one the plan cannot place (an actor that no node holds)."""


# ------------------------------------------------------------------------------------------ the machine


@dataclass(frozen=True)
class Hardware:
    """What the plan assumes of the cluster.

    Args:
        gpu_bytes: memory of each GPU.
        gpu_source: where ``gpu_bytes`` comes from (for the output).
        gpus_per_node: GPUs of each node, which the actors are packed into.
        default_gpus: GPUs an actor whose ``num_gpus`` is unset reserves (1 on a cluster with GPUs, else 0).
        cpu_bfloat16: whether ``auto`` dtypes resolve to bfloat16 on a CPU (``actors.model_store.bfloat16_is_fast``).
        cpus_per_node: CPUs of each node; None: not bounded (GPUs decide the nodes).
    """

    gpu_bytes: int
    gpu_source: str
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE
    default_gpus: float = 0.0
    cpu_bfloat16: bool = False
    cpus_per_node: float | None = None


def this_machine(config: Config, *, gpu_memory_gib: float | None = None, gpus_per_node: int | None = None) -> Hardware:
    """The hardware a plan of ``config`` assumes when it is made here (the only function of this module that
    looks at the machine): the GPU's memory from ``gpu_memory_gib``, else ``ray.gpu_memory_gib``, else the
    GPU this machine sees, else ``DEFAULT_GPU_GIB``; unset ``num_gpus`` count as the GPUs a local Ray instance
    would have here."""
    import torch

    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpu_memory_gib is not None:
        gpu_bytes, source = int(gpu_memory_gib * GIB), "--gpu-memory-gib"
    elif config.ray.gpu_memory_gib is not None:
        gpu_bytes, source = int(config.ray.gpu_memory_gib * GIB), "ray.gpu_memory_gib"
    elif visible:
        gpu_bytes = torch.cuda.get_device_properties(0).total_memory
        source = f"this machine's {torch.cuda.get_device_name(0)}"
    else:
        gpu_bytes, source = int(DEFAULT_GPU_GIB * GIB), "the default: no GPU here, no --gpu-memory-gib"
    uses_gpu = uses_gpus(config, 1.0 if visible else 0.0)
    cpus = None if uses_gpu else float(config.ray.num_cpus or os.cpu_count() or 1)
    return Hardware(
        gpu_bytes=gpu_bytes,
        gpu_source=source,
        gpus_per_node=gpus_per_node or visible or DEFAULT_GPUS_PER_NODE,
        default_gpus=1.0 if visible else 0.0,
        # On a GPU machine the probe would answer for the GPU; CPU actors there are planned in float32.
        cpu_bfloat16=False if visible else bfloat16_is_fast(),
        cpus_per_node=cpus,
    )


def with_gpus(config: Config, default_gpus: float) -> Config:
    """``config`` with every unset ``num_gpus`` set as ``actors.cluster.actor_gpus`` would on a cluster with
    (``default_gpus`` 1) or without GPUs (0); ``learner.device: cuda`` reserves one. Unvalidated copies: the
    colocated sampler keeps its unset value."""
    learner, sampler, serve = config.learner, config.sampler, config.serve
    learner_gpus = learner.num_gpus
    if learner_gpus is None:
        learner_gpus = 1.0 if learner.device == "cuda" else default_gpus
    update = {"learner": learner.model_copy(update={"num_gpus": learner_gpus})}
    if sampler.num_gpus is None and config.trainer.placement != "colocated":
        update["sampler"] = sampler.model_copy(update={"num_gpus": default_gpus})
    if serve.num_gpus is None:
        update["serve"] = serve.model_copy(update={"num_gpus": default_gpus})
    return config.model_copy(update=update)


def uses_gpus(config: Config, default_gpus: float) -> bool:
    """Whether any actor of ``config``'s run reserves a GPU (unset ``num_gpus`` as ``default_gpus``)."""
    fixed, pools = run_needs(with_gpus(config, default_gpus))
    requests = [need.request for need in fixed if need.count] + [pool.sampler for pool in pools]
    return any(request.get("GPU", 0.0) > 0 for request in requests)


# ------------------------------------------------------------------------------------------ placement


@dataclass(frozen=True)
class ActorGroup:
    """``count`` actors alike, each reserving ``request`` (CPUs, GPUs, custom resources) on one node."""

    what: str
    count: int
    request: dict[str, float]


@dataclass(frozen=True)
class Placement:
    groups: list[ActorGroup]
    colocated: bool
    nodes: int
    node: dict[str, float]  # what each node is taken to have

    def total(self, resource: str) -> float:
        return sum(group.count * group.request.get(resource, 0.0) for group in self.groups)


def place(config: Config, hardware: Hardware) -> Placement:
    """The actors of ``config``'s run at their wanted sizes (``sampler.count`` samplers of
    ``sampler.envs_per_sampler`` env actors each) and the fewest nodes that hold them, packed as
    ``actors.cluster.plan_actors`` packs them (custom resources aside).

    Raises:
        PlanError: one actor asks more than a node has.
    """
    colocated = config.trainer.placement == "colocated"
    fixed, pools = run_needs(with_gpus(config, hardware.default_gpus))
    labels = ["learner + sampler (one bundle)" if colocated else "learner", "serve replica"]
    groups = [ActorGroup(label, need.count, need.request) for label, need in zip(labels, fixed, strict=False)]
    for pool in pools:
        named = f" ({pool.env})" if len(pools) > 1 else ""
        if not colocated:
            groups.append(ActorGroup(f"sampler{named}", pool.count, pool.sampler))
        groups.append(ActorGroup(f"env actor{named}", pool.count * pool.envs, pool.env_actor))
        groups.append(ActorGroup(f"curriculum{named}", 1, {}))
    node = {"CPU": hardware.cpus_per_node or math.inf, "GPU": float(hardware.gpus_per_node)}

    def counted(request: dict[str, float]) -> dict[str, float]:
        return {name: amount for name, amount in request.items() if name in node}

    wanted_fixed = [dataclasses.replace(need, request=counted(need.request)) for need in fixed]
    wanted_pools = [
        dataclasses.replace(
            pool,
            sampler=counted(pool.sampler),
            env_actor=counted(pool.env_actor),
            min_count=pool.count,
            min_envs=pool.envs,
        )
        for pool in pools
    ]
    most = sum(need.count for need in fixed) + sum(pool.count * (1 + pool.envs) for pool in pools)
    for nodes in range(1, most + 1):
        try:
            plan_actors([dict(node) for _ in range(nodes)], wanted_fixed, wanted_pools)
        except ClusterError:
            continue
        return Placement(groups, colocated, nodes, node)
    too_big = next(group for group in groups if any(group.request.get(name, 0.0) > node[name] for name in node))
    raise PlanError(
        f"one {too_big.what} asks {format_request(too_big.request)}, more than a node has "
        f"({format_request(node)}); give nodes more (--gpus-per-node) or lower its num_gpus / num_cpus"
    )


# ------------------------------------------------------------------------------------------ memory


@dataclass(frozen=True)
class Item:
    """Bytes held for one purpose over the moments ``held`` (see the module docstring's phases)."""

    name: str
    nbytes: int
    held: frozenset[Moment] = ALWAYS


@dataclass(frozen=True)
class Holder:
    """What one GPU (or, on CPUs, one process) of a kind holds; ``count`` of them are alike. ``moments``: those
    its actors go through (a GPU without a learner has no ``load``, one without an engine no ``engine start``)."""

    what: str
    count: int
    gpu: bool
    items: list[Item]
    moments: tuple[Moment, ...] = MOMENTS

    def moment_bytes(self, moment: Moment) -> int:
        return sum(item.nbytes for item in self.items if moment in item.held)

    def phase_bytes(self, phase: Phase) -> int:
        """The most held at a moment of ``phase`` (0 for a phase this holder does not go through)."""
        return max((self.moment_bytes(m) for m in self.moments if PHASE[m] == phase), default=0)

    def moment_text(self, moment: Moment) -> str:
        """How ``plan`` names ``moment`` for this holder (an update without a learner is one moment)."""
        return "update" if moment == "update" and "update end" not in self.moments else MOMENT_TEXT[moment]

    @property
    def peak_moment(self) -> Moment:
        """The moment that holds the most (the first of equals)."""
        return max(self.moments, key=self.moment_bytes)

    @property
    def peak(self) -> int:
        return self.moment_bytes(self.peak_moment)

    def largest(self, moment: Moment, count: int = 3) -> list[Item]:
        return sorted((item for item in self.items if moment in item.held), key=lambda item: -item.nbytes)[:count]


@dataclass(frozen=True)
class Plan:
    """A run's placement and memory, and what does not fit."""

    model: str
    learner: str
    sampler: str
    placement: Placement
    holders: list[Holder]
    hardware: Hardware
    problems: list[str]

    @property
    def uses_gpu(self) -> bool:
        return any(holder.gpu for holder in self.holders)

    @property
    def fits(self) -> bool:
        return not self.problems


def dtype_bytes(dtype: str) -> int:
    return 2 if dtype == "bfloat16" else 4


def resolve(dtype: str, gpu: bool, cpu_bfloat16: bool) -> str:
    """``auto`` as ``actors.model_store.resolve_dtype`` resolves it on a GPU (bfloat16) or on this kind of CPU."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if gpu or cpu_bfloat16 else "float32"


def trained_items(
    what: str,
    trainable: int,
    *,
    frozen: int = 0,
    compute: int,
    deepspeed: bool,
    world: int,
    zero: int,
    offload: bool,
) -> list[Item]:
    """Weights, gradients and AdamW state of ``trainable`` parameters (and ``frozen`` ones beside them) of one
    learner, and under DeepSpeed what it loads before it casts and partitions them; see the module docstring."""
    moments_held = UPDATE if offload else FROM_FIRST_STEP
    name = "bfloat16" if compute == 2 else "float32"
    if not deepspeed:
        items = [
            Item(f"{what} {'float32 masters' if compute == 2 else 'weights, float32'}", 4 * trainable),
            Item(f"{what} gradients, float32", 4 * trainable, BACKWARD),
            Item(f"{what} AdamW moments, float32", 8 * trainable, moments_held),
        ]
        if compute == 2:
            items.append(Item(f"{what} weights, bfloat16 (compute copy)", 2 * trainable))
            items.append(Item(f"{what} gradients, bfloat16 (in a backward)", 2 * trainable, BACKWARD))
        if frozen:
            items.append(Item(f"frozen base weights, {name}", compute * frozen))
        return items
    split = {stage: world if zero >= stage else 1 for stage in (1, 2, 3)}
    zero_note = f", ZeRO-{zero} 1/{world}" if world > 1 and zero else ""
    if zero >= 3:  # a flat partition made at start and kept
        gradients = Item(f"{what} gradients, {name}{zero_note}, kept", compute * trainable // split[2], STARTED)
    else:
        gradients = Item(
            f"{what} gradients, {name}{zero_note if zero >= 2 else ''}", compute * trainable // split[2], BACKWARD
        )
    items = [
        Item(f"{what} weights as loaded, float32, whole", 4 * trainable, LOADING),
        Item(f"{what} weights, {name}{zero_note if zero >= 3 else ''}", compute * trainable // split[3], STARTED),
        gradients,
        Item(f"{what} AdamW moments, float32{zero_note if zero >= 1 else ''}", 8 * trainable // split[1], moments_held),
    ]
    if compute == 2:
        items.append(
            Item(f"{what} float32 masters{zero_note if zero >= 1 else ''}", 4 * trainable // split[1], STARTED)
        )
    if frozen:
        items.append(Item(f"frozen base weights as loaded, {name}, whole", compute * frozen, LOADING))
        items.append(
            Item(f"frozen base weights, {name}{zero_note if zero >= 3 else ''}", compute * frozen // split[3], STARTED)
        )
    return items


def learner_items(config: Config, shape: Shape, *, gpu: bool, cpu_bfloat16: bool) -> tuple[list[Item], str]:
    """What one learner holds, and a line describing it."""
    cfg = config.learner
    precision = cfg.precision
    if precision == "auto":
        precision = "bf16-mixed" if gpu or cpu_bfloat16 else "float32"
    compute = 2 if precision == "bf16-mixed" else 4
    algorithm = build_algorithm(config.algorithm.name, config.algorithm.model_extra or {})
    deepspeed = cfg.backend == "deepspeed"
    trainer = {
        "deepspeed": deepspeed,
        "world": cfg.count if deepspeed else 1,
        "zero": cfg.zero_stage if deepspeed else 0,
        "offload": config.trainer.placement == "colocated",
    }
    parameters = shape.parameters()
    if cfg.lora.enabled:
        adapters = shape.lora_parameters(cfg.lora)
        items = trained_items("LoRA adapter", adapters, frozen=parameters, compute=compute, **trainer)
        training = f"LoRA r {cfg.lora.r} on {describe_targets(cfg.lora)}: {count_text(adapters)} trainable"
    else:
        adapters = 0
        items = trained_items("policy", parameters, compute=compute, **trainer)
        training = "full weights"
    reference, reference_adapter, critic = "none", False, 0
    if algorithm.needs_reference:
        if cfg.lora.enabled:
            reference = "the policy's base with the adapter off (no copy)"
            if config.model.adapter is not None:
                reference = "the policy's base with the starting adapter, frozen (no copy of the base)"
                reference_adapter = True
                # a float32 adapter, with its bfloat16 compute copy under the torch backend's bf16-mixed
                frozen = compute if deepspeed else 4 + (2 if compute == 2 else 0)
                items.append(Item("starting adapter, frozen (the reference)", frozen * adapters))
        else:
            reference = "a copy of the starting weights"
            items.append(Item(f"reference model, {'bfloat16' if compute == 2 else 'float32'}", compute * parameters))
    tokens = cfg.pack_tokens if cfg.packing and cfg.pack_tokens else config.sampler.max_context_tokens
    rows = cfg.micro_batch_size
    items.append(activations_item("activations", shape, rows * tokens, compute, cfg.gradient_checkpointing))
    if algorithm.needs_critic:
        critic = shape.decoder_parameters() + shape.hidden + 1
        items += trained_items("critic", critic, compute=compute, **trainer)
        items.append(activations_item("critic activations", shape, rows * tokens, compute, cfg.gradient_checkpointing))
    targets = rows * tokens if cfg.packing else rows * min(tokens, longest_horizon(config) * max_new_tokens(config))
    graph = algorithm.differentiates_entropy
    tensors = LOGIT_TENSORS[graph]
    items.append(
        Item(
            f"logits: {targets:,} targets x {shape.vocab:,} vocabulary x {tensors} float32"
            f"{' (entropy graph)' if graph else ''}",
            4 * targets * shape.vocab * tensors,
            BACKWARD,
        )
    )
    if deepspeed and cfg.zero_stage >= 3:
        whole = parameters + adapters * (2 if reference_adapter else 1) + critic
        items += [
            Item(f"ZeRO-3 reduce bucket, {ZERO3_REDUCE_BUCKET:,} elements", compute * ZERO3_REDUCE_BUCKET, STARTED),
            Item(
                "ZeRO-3 parameters gathered in a forward or backward",
                compute * min(whole, ZERO3_MAX_LIVE_PARAMETERS),
                BACKWARD,
            ),
            Item(
                "ZeRO-3 weights gathered for the parameter norm, a bucket at a time",
                min(compute * whole, PARAMETER_NORM_BUCKET_BYTES),
                UPDATE_END,
            ),
            Item("ZeRO-3 weights gathered whole for a broadcast", compute * whole, SYNC)
            if broadcasts(config, gpu)
            else Item(
                "ZeRO-3 weights gathered for the object store, a bucket at a time",
                min(compute * whole, bucket_bytes(config)),
                SYNC,
            ),
        ]
    if gpu:
        items.append(cuda_context("learner"))
        if broadcasts(config, gpu):
            published = (adapters or parameters) * dtype_bytes(resolve(config.sampler.dtype, True, False))
            items.append(Item("a weight broadcast's bucket (rank 0)", min(bucket_bytes(config), published), SYNC))
    line = (
        f"{cfg.count} x {cfg.backend}{f' ZeRO-{cfg.zero_stage}' if deepspeed else ''}, {precision}, {training}\n"
        f"         reference: {reference}; micro-batch {rows} x {tokens:,} tokens"
        f"{', gradient checkpointing' if cfg.gradient_checkpointing else ''}"
    )
    return items, line


def cuda_context(what: str, held: frozenset[Moment] = ALWAYS) -> Item:
    return Item(f"CUDA context ({what})", CUDA_CONTEXT_BYTES, held)


def broadcasts(config: Config, learner_gpu: bool) -> bool:
    """Whether rank 0 packs each version into buckets on its GPU: ``trainer.weight_sync.method`` ``broadcast``
    (``auto`` on a GPU), unless one colocated learner shares its GPU with its engine (CUDA IPC, no buckets)."""
    method = config.trainer.weight_sync.method
    if method == "auto":
        method = "broadcast" if learner_gpu else "object_store"
    one_gpu = config.trainer.placement == "colocated" and config.learner.count == 1
    return method == "broadcast" and not one_gpu


def bucket_bytes(config: Config) -> int:
    return int(config.trainer.weight_sync.bucket_mb * MIB)


def activations_item(what: str, shape: Shape, tokens: int, compute: int, checkpointing: bool) -> Item:
    layer = shape.activation_elements_per_token() * tokens * compute
    if checkpointing:
        kept = shape.layers * shape.hidden * tokens * compute + layer
        return Item(f"{what}, {tokens:,} tokens, checkpointed", kept, BACKWARD)
    return Item(f"{what}, {tokens:,} tokens x {shape.layers} layers", shape.layers * layer, BACKWARD)


def longest_horizon(config: Config) -> int:
    """The most turns an episode of the run may take, over its envs' schedules."""
    schedules = [entry.curriculum or config.curriculum for entry in config.envs] or [config.curriculum]
    return max(schedule.horizon if schedule.schedule == "fixed" else max(schedule.horizons) for schedule in schedules)


def max_new_tokens(config: Config) -> int:
    return config.sampler.sampling.max_new_tokens


def engine_items(
    config: Config,
    shape: Shape,
    *,
    engine: str,
    dtype: str,
    gpu: bool,
    kept_tokens: int,
    decode_positions: int,
    vllm_share: float,
    tensor_parallel: int,
    hardware: Hardware,
    what: str,
    awake: frozenset[Moment] = STARTED,
    fit_cache_to_memory: bool = False,
    resident: int = 0,
) -> tuple[list[Item], list[str]]:
    """What one engine (a sampler's or a serve replica's) holds on each of its GPUs (its process's CUDA context
    aside), and what cannot fit. ``awake``: the moments it holds its weights and cache (a colocated engine
    sleeps in the update). With ``fit_cache_to_memory`` the kept key/values get at most half of what the GPU
    has free after the model loads beside ``resident`` bytes (as the transformers engine sizes an unset
    ``sampler.kv_cache_tokens``)."""
    weights = shape.parameters() * dtype_bytes(dtype)
    problems = []
    # A version arrives one bucket at a time on the engine's GPU.
    arriving = [
        Item(
            f"{what} weights arriving, one bucket",
            min(weights, max(bucket_bytes(config), OBJECT_STORE_BUCKET_BYTES)),
            SYNC,
        )
    ] * gpu
    if engine == "vllm" and gpu:
        share = int(vllm_share * hardware.gpu_bytes)
        if weights // tensor_parallel >= share:
            problems.append(
                f"each {what}'s vLLM share ({vllm_share:g} of {gib(hardware.gpu_bytes)} GiB = {gib(share)} GiB) "
                f"cannot hold its weights ({gib(weights // tensor_parallel)} GiB per GPU) and a key/value cache: "
                "raise its vllm.gpu_memory_utilization or vllm.tensor_parallel_size"
            )
        items = [
            Item(f"vLLM engine ({vllm_share:g} of the GPU: weights, key/value cache, CUDA graphs)", share, awake),
            cuda_context(f"{what}'s vLLM worker", STARTED),
        ]
        if STARTED - awake:  # asleep, the engine gives back its weights and cache, not its CUDA graphs
            items.append(Item(f"{what}'s vLLM CUDA graphs, kept asleep", VLLM_CUDA_GRAPH_BYTES, STARTED - awake))
        return items + arriving, problems
    items = [Item(f"{what} weights, {dtype}", weights, awake)]
    if engine == "transformers":
        lora = config.learner.lora
        if lora.enabled and not gpu:
            # Each version is merged from the adapted layers' original weights, kept in host memory.
            bases = shape.adapted_parameters(lora) * dtype_bytes(dtype)
            items.append(Item(f"{what} LoRA-adapted layers' base weights", bases, awake))
        per_token = shape.kv_bytes_per_token(dtype_bytes(dtype))
        if fit_cache_to_memory:
            kept_tokens = min(kept_tokens, max(0, hardware.gpu_bytes - resident - weights) // 2 // per_token)
        items.append(
            Item(
                f"{what} key/value cache, {kept_tokens:,} kept + {decode_positions:,} decoding positions",
                (kept_tokens + decode_positions) * per_token,
                awake,
            )
        )
    return items + arriving, problems


def sampler_items(
    config: Config, shape: Shape, *, gpu: bool, hardware: Hardware, resident: int, awake: frozenset[Moment]
) -> tuple[list[Item], list[str]]:
    """A sampler's engine; ``resident``: the bytes on its GPU besides it when it loads; ``awake``: the moments
    it holds its weights and cache."""
    sampler = config.sampler
    rows = min(
        sampler.max_batch_size, (sampler.max_envs_per_sampler or sampler.envs_per_sampler) * sampler.envs_per_actor
    )
    return engine_items(
        config,
        shape,
        engine=sampler.engine,
        dtype=resolve(sampler.dtype, gpu, hardware.cpu_bfloat16),
        gpu=gpu,
        kept_tokens=sampler.episode_cache_tokens,
        decode_positions=rows * sampler.max_context_tokens,
        vllm_share=sampler.vllm.gpu_memory_utilization,
        tensor_parallel=sampler.vllm.tensor_parallel_size,
        hardware=hardware,
        what="sampler",
        awake=awake,
        fit_cache_to_memory=gpu and sampler.kv_cache_tokens is None,
        resident=resident,
    )


def serve_items(config: Config, shape: Shape, *, gpu: bool, hardware: Hardware) -> tuple[list[Item], list[str]]:
    serve = config.serve
    return engine_items(
        config,
        shape,
        engine=serve.engine or config.sampler.engine,
        dtype=resolve(config.sampler.dtype, gpu, hardware.cpu_bfloat16),
        gpu=gpu,
        kept_tokens=0,
        decode_positions=serve.kv_cache_tokens,
        vllm_share=serve.vllm.gpu_memory_utilization,
        tensor_parallel=serve.vllm.tensor_parallel_size,
        hardware=hardware,
        what="serve replica",
    )


def sharing(gpus: float) -> int:
    """How many actors that each reserve ``gpus`` (a fraction) Ray may put on one GPU."""
    return max(1, math.floor(1 / gpus + 1e-9)) if 0 < gpus < 1 else 1


def make_plan(config: Config, shape: Shape, hardware: Hardware, *, model: str) -> Plan:
    """The placement of ``config``'s run and what each of its GPUs (or, on CPUs, processes) holds.

    Args:
        config: the run's config.
        shape: its model's shape.
        hardware: what the cluster is taken to have.
        model: a line naming the model and where its shape was read (for the output).

    Raises:
        ArchitectureError: a LoRA target ``shape`` does not count.
        PlanError: an actor that no node holds.
    """
    placement = place(config, hardware)
    resolved = with_gpus(config, hardware.default_gpus)
    learner_gpus = resolved.learner.num_gpus
    learner_on_gpu = learner_gpus > 0 and resolved.learner.device != "cpu"
    learner, learner_line = learner_items(resolved, shape, gpu=learner_on_gpu, cpu_bfloat16=hardware.cpu_bfloat16)
    colocated = placement.colocated
    sampler_gpus = learner_gpus if colocated else resolved.sampler.num_gpus
    sampler_on_gpu = sampler_gpus > 0
    # Colocated learners start before their samplers: an engine loads beside what the learner keeps.
    kept = sum(item.nbytes for item in learner if "engine start" in item.held) if colocated else 0
    sampler, problems = sampler_items(
        resolved,
        shape,
        gpu=sampler_on_gpu,
        hardware=hardware,
        resident=CUDA_CONTEXT_BYTES + kept,
        awake=AWAKE if colocated else STARTED,
    )
    sampler += [cuda_context("sampler", STARTED)] * sampler_on_gpu
    has_samplers = config.trainer.mode not in ("offline", "gateway")
    samplers = config.sampler.count * max(1, len(config.envs))
    holders = []
    vllm: list[tuple[Holder, int, float]] = []  # holders of vLLM engines: engines on each GPU, their share
    sampler_vllm = sampler_on_gpu and resolved.sampler.engine == "vllm"
    if colocated and learner_on_gpu:
        share = sharing(learner_gpus)
        holders.append(
            Holder(
                f"learner + sampler, colocated{f' ({share} pairs on each GPU)' if share > 1 else ''}",
                math.ceil(config.learner.count / share),
                True,
                [dataclasses.replace(item, nbytes=item.nbytes * share) for item in learner + sampler],
            )
        )
        vllm += [(holders[-1], share, resolved.sampler.vllm.gpu_memory_utilization)] * sampler_vllm
    else:
        holders.append(shared_holder("learner", config.learner.count, learner_gpus, learner_on_gpu, learner))
        if has_samplers:
            holders.append(shared_holder("sampler", samplers, sampler_gpus, sampler_on_gpu, sampler, engine=True))
            vllm += [(holders[-1], sharing(sampler_gpus), resolved.sampler.vllm.gpu_memory_utilization)] * sampler_vllm
    if config.serve.enabled:
        serve_gpus = resolved.serve.num_gpus
        on_gpu = serve_gpus > 0
        serve, serve_problems = serve_items(resolved, shape, gpu=on_gpu, hardware=hardware)
        replicas = config.serve.autoscaling.min_replicas if config.serve.autoscaling else config.serve.num_replicas
        serve += [cuda_context("serve replica")] * on_gpu
        holders.append(shared_holder("serve replica", replicas, serve_gpus, on_gpu, serve, engine=True))
        if on_gpu and (resolved.serve.engine or resolved.sampler.engine) == "vllm":
            vllm.append((holders[-1], sharing(serve_gpus), resolved.serve.vllm.gpu_memory_utilization))
        problems += serve_problems
    for holder, engines, utilization in vllm:
        problems += vllm_refusal(holder, engines, utilization, hardware)
    for holder in holders:
        if holder.gpu and holder.peak > hardware.gpu_bytes:
            problems.append(overflow(holder, hardware))
    line = resolved.sampler.engine + ", " + resolve(config.sampler.dtype, sampler_on_gpu, hardware.cpu_bfloat16)
    sampler_line = f"{samplers} x {line}" if has_samplers else "none (trainer.mode: " + config.trainer.mode + ")"
    return Plan(model, learner_line, sampler_line, placement, holders, hardware, problems)


def shared_holder(what: str, count: int, gpus: float, gpu: bool, items: list[Item], *, engine: bool = False) -> Holder:
    """``count`` actors of one kind, each holding ``items``: per GPU as many as share one (fractional
    ``num_gpus``), or per process on CPUs. A learner's GPU goes through every moment but the engines' start,
    an ``engine``'s through every moment but the learners' load and the update's end (nothing changes then)."""
    moments = ENGINE_MOMENTS if engine else LEARNER_MOMENTS
    if not gpu:
        return Holder(f"{what} process", count, False, items, moments)
    share = sharing(gpus)
    if share == 1:
        return Holder(what, count, True, items, moments)
    return Holder(
        f"{what} ({share} on each GPU)",
        math.ceil(count / share),
        True,
        [dataclasses.replace(item, nbytes=item.nbytes * share) for item in items],
        moments,
    )


def vllm_refusal(holder: Holder, engines: int, utilization: float, hardware: Hardware) -> list[str]:
    """vLLM's own start-up check on each GPU of ``holder``: ``engines`` engines starting there each refuse unless
    ``utilization`` of the GPU's whole memory is free beside what is there before them (the learners' weights,
    the processes' CUDA contexts)."""
    share = int(utilization * hardware.gpu_bytes)
    before = holder.moment_bytes("engine start") - engines * share
    if before + engines * share <= hardware.gpu_bytes:
        return []
    engines_text = f", {engines} engines" if engines > 1 else ""
    message = (
        f"vLLM would refuse to start on each GPU of the {holder.what}: it starts only with its share free "
        f"({utilization:g} of {gib(hardware.gpu_bytes)} GiB = {gib(share)} GiB{engines_text}), and {gib(before)} GiB "
        "are held there before it; lower vllm.gpu_memory_utilization"
    )
    return [message]


def overflow(holder: Holder, hardware: Hardware) -> str:
    moment = holder.peak_moment
    largest = ", ".join(f"{item.name} ({gib(item.nbytes)} GiB)" for item in holder.largest(moment))
    when = holder.moment_text(moment)
    return (
        f"each GPU of the {holder.what} would hold {gib(holder.peak)} GiB at its peak, in the {when}, more than "
        f"its {gib(hardware.gpu_bytes)} GiB ({hardware.gpu_source}); the largest items then: {largest}"
    )


def check_fits(plan: Plan) -> None:
    """Raise :class:`PlanError` naming, for every GPU that cannot hold its worst phase, that phase and its
    largest items (and any vLLM engine that would refuse to start)."""
    if plan.problems:
        raise PlanError(
            "the run does not fit in GPU memory: "
            + "; ".join(plan.problems)
            + ". See `agentgym-rl plan CONFIG`; lower learner.micro_batch_size or sampler.max_context_tokens, "
            "turn on learner.gradient_checkpointing or learner.lora.enabled, or split the weights over more "
            "learners (learner.backend=deepspeed, learner.zero_stage=3); set ray.gpu_memory_gib if the GPUs "
            "are larger"
        )


def plan_for(config: Config, *, gpu_memory_gib: float | None = None, gpus_per_node: int | None = None) -> Plan:
    """The plan of ``config``'s run made here: its model's architecture read without weights
    (``actors.architectures``), the hardware from ``this_machine``.

    Raises:
        ModelError: the model cannot be found (``read_architecture``).
        ArchitectureError: a model or LoRA target that ``Shape`` does not count.
        PlanError: see ``make_plan``.
    """
    architecture = read_architecture(config.model.name)
    shape = Shape.from_config(architecture.config)
    hardware = this_machine(config, gpu_memory_gib=gpu_memory_gib, gpus_per_node=gpus_per_node)
    return make_plan(config, shape, hardware, model=describe_model(config.model.name, architecture.source, shape))


def check_memory(config: Config) -> None:
    """``train``'s check before anything starts: a run that reserves GPUs (by its settings, or unset ones on
    this machine's GPUs) and whose plan does not fit is refused; a CPU run never is.

    Raises:
        PlanError: the run does not fit; the message names each GPU's largest items.
    """
    import torch

    if not uses_gpus(config, 1.0 if torch.cuda.is_available() else 0.0):
        return
    try:
        plan = plan_for(config)
    except (ArchitectureError, PlanError) as exc:
        # The plan cannot count or place this run (e.g. another architecture, or nodes of another size than
        # assumed here; Ray's own check places it after start): it goes on, as before there was a plan.
        log.warning("no memory plan for this run; it starts unchecked", reason=str(exc))
        return
    check_fits(plan)


# ------------------------------------------------------------------------------------------ output


def gib(nbytes: float) -> str:
    return f"{nbytes / GIB:.2f}"


def count_text(count: int) -> str:
    """``7.62 B``, ``40.37 M``, ``86,016``."""
    if count >= 10**9:
        return f"{count / 1e9:.2f} B"
    if count >= 10**6:
        return f"{count / 1e6:.2f} M"
    return f"{count:,}"


def describe_targets(lora: LoraConfig) -> str:
    return lora.target_modules if isinstance(lora.target_modules, str) else ", ".join(lora.target_modules)


def format_request(request: dict[str, float]) -> str:
    shown = [f"{name} {amount:g}" for name, amount in request.items() if not math.isinf(amount)]
    return ", ".join(shown) or "nothing"


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}{'es' if noun.endswith('s') else 's'}"


def describe_model(name: str, source: str, shape: Shape) -> str:
    return (
        f"{name}: {shape.model_type}, {count_text(shape.parameters())} parameters ({shape.layers} layers, hidden "
        f"{shape.hidden:,}, vocabulary {shape.vocab:,})\n         read from {source}"
    )


def held_text(item: Item, holder: Holder) -> str:
    """When ``item`` is held among ``holder``'s moments: ``always``, ``once loaded`` (all but the learners'
    load), else the moments (the update's two as ``update`` when both)."""
    moments = [moment for moment in holder.moments if moment in item.held]
    if len(moments) == len(holder.moments):
        return "always"
    if "load" in holder.moments and moments == [m for m in holder.moments if m != "load"]:
        return "once loaded"
    if "update" in moments and "update end" in moments:
        moments.remove("update end")
    elif "update" in moments and "update end" in holder.moments:
        moments[moments.index("update")] = "backward"
    return ", ".join(moments)


def format_plan(plan: Plan) -> str:
    """The plan as ``agentgym-rl plan`` prints it: the model, learner and samplers; the actors and their
    bundles; per kind of GPU (or, on CPUs, of process) what it holds, largest first, and when; what it holds at
    each moment of each phase, and its peak."""
    placement, hardware = plan.placement, plan.hardware
    lines = [f"model    {plan.model}", f"learner  {plan.learner}", f"sampler  {plan.sampler}", ""]
    kind = "colocated: learner i and sampler i in one bundle" if placement.colocated else "disaggregated"
    lines.append(f"placement ({kind})")
    lines.append(f"  {'actors':<32} {'count':>5}  {'each':<22} {'CPUs':>6} {'GPUs':>5}")
    for group in placement.groups:
        cpus, gpus = (group.count * group.request.get(name, 0.0) for name in ("CPU", "GPU"))
        lines.append(
            f"  {group.what:<32} {group.count:>5}  {format_request(group.request):<22} {cpus:>6.2f} {gpus:>5g}"
        )
    lines.append(f"  {'in all':<32} {'':>5}  {'':<22} {placement.total('CPU'):>6.2f} {placement.total('GPU'):>5g}")
    if hardware.cpus_per_node is None:
        node = f"{plural(hardware.gpus_per_node, 'GPU')} each (CPUs not counted)"
    else:
        node = f"{hardware.cpus_per_node:g} CPUs each"
    lines.append(f"  nodes: {placement.nodes}, of {node}")
    lines.append("")
    if plan.uses_gpu:
        lines.append(f"memory per GPU (a GPU holds {gib(hardware.gpu_bytes)} GiB: {hardware.gpu_source})")
    else:
        lines.append("memory per process (no GPU is used: the run reserves none)")
    width = max(len(item.name) for holder in plan.holders for item in holder.items)
    for holder in plan.holders:
        lines.append(f"  {holder.what}: {plural(holder.count, 'GPU' if holder.gpu else 'process')}")
        lines.append(f"    {'':<{width}} {'GiB':>6}  held")
        for item in sorted(holder.items, key=lambda item: -item.nbytes):
            lines.append(f"    {item.name:<{width}} {gib(item.nbytes):>6}  {held_text(item, holder)}")
        lines.append("    in the phases")
        for moment in holder.moments:
            lines.append(f"    {'  ' + holder.moment_text(moment):<{width}} {gib(holder.moment_bytes(moment)):>6}")
        verdict = ""
        if holder.gpu:
            left = hardware.gpu_bytes - holder.peak
            verdict = f"fits, {gib(left)} GiB left" if left >= 0 else f"does not fit: {gib(-left)} GiB too much"
        peak = f"peak: {holder.moment_text(holder.peak_moment)}"
        lines.append(f"    {peak:<{width}} {gib(holder.peak):>6}  {verdict}".rstrip())
    lines.append("")
    if not plan.uses_gpu:
        lines.append("fits: no GPU is used, so there is no GPU memory to run out of")
    elif plan.fits:
        lines.append("fits: every GPU holds its peak")
    else:
        lines.extend(f"does not fit: {problem}" for problem in plan.problems)
    return "\n".join(lines)

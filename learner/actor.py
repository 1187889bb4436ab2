"""``LearnerActor``: owns the trainable policy (and critic), updates it from trajectories, publishes weights."""

from __future__ import annotations

import contextlib
import functools
import time
from pathlib import Path
from typing import TYPE_CHECKING

import structlog
import torch

from agentgym_rl.actors.adapters import load_policy, read_checked_adapter, write_base_model
from agentgym_rl.actors.heap import release_free_heap, return_large_frees_to_the_os
from agentgym_rl.actors.logs import Timeline
from agentgym_rl.actors.model_store import load_model, load_tokenizer, resolve_dtype
from agentgym_rl.actors.threads import set_torch_threads
from agentgym_rl.actors.trajectory import Trajectory
from agentgym_rl.actors.transport import DeviceIdentity, SharedWeights, device_identity, share_cuda_tensors
from agentgym_rl.actors.weight_sync import GroupAddress, WeightGroup, free_address
from agentgym_rl.actors.weights import WeightsPayload, pack_state_dict
from agentgym_rl.configs.errors import AgentGymError
from agentgym_rl.configs.schema import AlgorithmConfig, LearnerConfig, ModelConfig
from agentgym_rl.envs.actor import hide_unreserved_gpus
from agentgym_rl.learner.algorithms import build_algorithm
from agentgym_rl.learner.algorithms.base import (
    ADVANTAGES,
    LOGPROBS,
    LOSS_MASK,
    OLD_LOGPROBS,
    OLD_VALUES,
    REF_LOGPROBS,
    VALUES,
)
from agentgym_rl.learner.backends import DeepSpeedBackend, TorchBackend
from agentgym_rl.learner.batching import collate, pack, plan_rows, select_rows, unpack_targets
from agentgym_rl.learner.forward import ValueModel, masked_token_outputs
from agentgym_rl.learner.lora_policy import (
    TRAINED_ADAPTER,
    adapter_state_dict,
    add_reference_adapter,
    apply_lora,
    as_reference,
    check_adapter_matches,
    is_lora,
    load_adapter_state_dict,
    merged_state_dict,
)
from agentgym_rl.learner.losses import masked_mean
from agentgym_rl.learner.precision import BFloat16Compute, resolve_precision
from agentgym_rl.learner.schedule import lr_multiplier

if TYPE_CHECKING:
    import ray

log = structlog.get_logger()

POLICY_DIR = "policy"
LEARNER_STATE = "learner.pt"
PUBLISH_BUCKET_BYTES = 256 * 2**20  # trainer.weight_sync.bucket_mb's default


class LearnerDeviceError(AgentGymError, RuntimeError):
    """``learner.device`` names a device this learner cannot use."""


def learner_device(setting: str) -> torch.device:
    """The device of ``learner.device``: ``auto`` is the GPU this process sees (a learner sees only the one it
    reserved), else the CPU."""
    if setting == "auto":
        setting = "cuda" if torch.cuda.is_available() else "cpu"
    if setting == "cuda" and not torch.cuda.is_available():
        raise LearnerDeviceError(
            "learner.device='cuda' but this learner sees no CUDA GPU: reserve one with learner.num_gpus, "
            "or set learner.device='auto'"
        )
    return torch.device(setting)


class LearnerActor:
    """Run it with ``ray.remote``.

    The learner computes on ``learner.device``: the policy, reference model, critic and optimizer state live
    there and each micro-batch is moved there for its forward and loss; the batch itself, its advantages and
    every published or saved tensor stay on (or come back to) the CPU.

    Args:
        model: model section (the policy and, when the algorithm needs one, the frozen reference).
        learner: learner section.
        algorithm: algorithm section (name, group_size and the algorithm's hyperparameters).
        seed: the run seed (init of new heads, minibatch shuffling).
        sampler_dtype: the samplers' ``sampler.dtype``; published weights travel in it (``auto`` is resolved
            with this machine's hardware, as a sampler on the same kind of node resolves it).
        total_updates: optimizer steps the run will take (for the LR schedule); 0 if unknown.
        rank, world_size, master_addr, master_port: this learner's place in the DeepSpeed process
            group (``learner.backend: deepspeed``); ignored by the torch backend.
    """

    def __init__(
        self,
        *,
        model: ModelConfig,
        learner: LearnerConfig,
        algorithm: AlgorithmConfig,
        seed: int,
        sampler_dtype: str = "auto",
        total_updates: int = 0,
        rank: int = 0,
        world_size: int = 1,
        master_addr: str = "127.0.0.1",
        master_port: int = 0,
        offload_optimizer: bool = False,
    ) -> None:
        self._set_up_process(learner, seed)
        self.config = learner
        self.model_config = model
        self.published_bytes = 0
        self.offload_optimizer = offload_optimizer
        self.events = Timeline()
        self.weight_group: WeightGroup | None = None  # joined when the run broadcasts its weights
        self.shared_tensors: dict[str, torch.Tensor] | None = None  # shared by CUDA IPC until the receivers load
        self.tokenizer = load_tokenizer(model.name)
        self.pad_token_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.algorithm = build_algorithm(algorithm.name, algorithm.model_extra or {})
        self.precision = resolve_precision(learner.precision, self.device)
        compute_dtype = "bfloat16" if self.precision == "bf16-mixed" else "float32"
        self.publish_dtype = resolve_dtype(sampler_dtype)
        self.policy = self._load_policy(compute_dtype)
        self.reference = self._load_reference(compute_dtype)
        self.critic = self._load_critic()
        self._build_optimizer(total_updates)
        # Counted before ZeRO-3 (if chosen) partitions the parameters.
        self.num_parameters = sum(p.numel() for p in self.policy.parameters())
        self._build_backend(rank=rank, world_size=world_size, master_addr=master_addr, master_port=master_port)
        self.shuffle = torch.Generator().manual_seed(seed)
        self.version = 0
        self.events.add("ready")

    def _set_up_process(self, learner: LearnerConfig, seed: int) -> None:
        """Claim this process: only the GPU it reserved, its torch threads, the run seed, its device
        (``self.device``), and large frees returned to the OS."""
        hide_unreserved_gpus()
        set_torch_threads(learner.num_threads)
        torch.manual_seed(seed)
        self.device = learner_device(learner.device)
        return_large_frees_to_the_os()

    def _load_policy(self, compute_dtype: str) -> torch.nn.Module:
        """The trainable policy on ``self.device``, in training mode.

        The trained weights of record stay float32; under bf16-mixed a bfloat16 copy (or DeepSpeed's) computes.
        A LoRA run trains a float32 adapter over the exact base, which it loads in the compute dtype (no float32
        copy of a frozen base); a full run starts from the base with any adapter merged.
        """
        model, learner = self.model_config, self.config
        policy = (
            load_model(model.name, compute_dtype) if learner.lora.enabled else load_policy(model.name, model.adapter)
        )
        if learner.gradient_checkpointing:
            # transformers 5 renamed the switch; older releases only have the first name.
            enable = getattr(policy, "activation_checkpointing_enable", None)
            (enable or policy.gradient_checkpointing_enable)()
            policy.config.use_cache = False
            if learner.lora.enabled:  # checkpointed blocks need an input that requires grad
                policy.enable_input_require_grads()
        if learner.lora.enabled:
            policy = apply_lora(policy, learner.lora)
            if model.adapter is not None:  # go on training a saved adapter (e.g. an SFT stage's)
                saved = read_checked_adapter(model.adapter, model.name)
                check_adapter_matches(saved, learner.lora, model.adapter)
                load_adapter_state_dict(policy, saved.tensors)
                if self.algorithm.needs_reference:  # the reference: the starting adapter, frozen beside it
                    add_reference_adapter(policy, learner.lora, saved.tensors)
        return policy.to(self.device).train()

    def _load_reference(self, compute_dtype: str) -> torch.nn.Module | None:
        """A full run's frozen reference model (when the algorithm needs one). A LoRA run's reference is its policy
        with the starting adapter (or none) in place of the trained one (``_as_reference``), so the base weights
        are held once: None here."""
        if not self.algorithm.needs_reference or self.config.lora.enabled:
            return None
        reference = load_policy(self.model_config.name, self.model_config.adapter, compute_dtype)
        return reference.requires_grad_(False).to(self.device)

    def _load_critic(self) -> ValueModel | None:
        """The value model on ``self.device``, in training mode, when the algorithm needs a critic."""
        if not self.algorithm.needs_critic:
            return None
        critic = ValueModel(load_policy(self.model_config.name, self.model_config.adapter)).to(self.device)
        return critic.train()

    def _build_optimizer(self, total_updates: int) -> None:
        """AdamW over the trainable policy parameters (and the critic's, at ``critic_lr``) with the learning-rate
        schedule over ``total_updates`` optimizer steps; counts the trainable parameters."""
        learner = self.config
        groups = [{"params": [p for p in self.policy.parameters() if p.requires_grad], "lr": learner.lr}]
        if self.critic is not None:
            critic_lr = getattr(self.algorithm.config, "critic_lr", None) or learner.lr
            groups.append({"params": list(self.critic.parameters()), "lr": critic_lr})
        self.optimizer = torch.optim.AdamW(groups, lr=learner.lr, weight_decay=learner.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            functools.partial(
                lr_multiplier,
                warmup_steps=learner.warmup_steps,
                total_steps=total_updates,
                schedule=learner.lr_schedule,
            ),
        )
        self.num_trainable = sum(p.numel() for group in groups for p in group["params"])

    def _build_backend(self, *, rank: int, world_size: int, master_addr: str, master_port: int) -> None:
        """The backend that steps the optimizer (torch, or DeepSpeed in a process group of ``world_size``) and what
        forward and backward run on: the policy (and critic) itself, or its bfloat16 copy."""
        learner = self.config
        modules = torch.nn.ModuleDict({"policy": self.policy})
        if self.critic is not None:
            modules["critic"] = self.critic
        self.mixed: BFloat16Compute | None = None
        if learner.backend == "deepspeed":
            # DeepSpeed's own bf16 mode casts the modules in place and keeps float32 masters in its optimizer.
            self.backend = DeepSpeedBackend(
                modules,
                self.optimizer,
                self.scheduler,
                grad_clip=learner.grad_clip,
                zero_stage=learner.zero_stage,
                rank=rank,
                world_size=world_size,
                master_addr=master_addr,
                master_port=master_port,
                bf16=self.precision == "bf16-mixed",
                nccl=self.device.type == "cuda",
            )
            compute = modules
        else:
            if self.precision == "bf16-mixed":
                self.mixed = BFloat16Compute(modules)
            self.backend = TorchBackend(
                modules, self.optimizer, self.scheduler, grad_clip=learner.grad_clip, compute=self.mixed
            )
            compute = self.mixed.module if self.mixed is not None else modules
        self.compute_policy = compute["policy"]
        self.compute_critic = compute["critic"] if self.critic is not None else None

    def describe(self) -> dict:
        """Derived numbers logged once at start."""
        return {
            "parameters": self.num_parameters,
            "trainable_parameters": self.num_trainable,
            "algorithm": type(self.algorithm).__name__,
            "precision": self.precision,
            "device": str(self.device),
            "old_logprobs": self.old_logprobs_source,
            "reference_model": self.reference is not None,
            "reference": self.reference_source,
            "critic": self.critic is not None,
        }

    @property
    def reference_source(self) -> str | None:
        """What scores ``ref_logprobs``: ``model`` (a frozen model of its own), ``base`` (a LoRA policy with its
        adapter disabled), ``starting adapter`` (a LoRA policy with the run's starting adapter in place of the
        trained one), or None (the algorithm needs no reference)."""
        if not self.algorithm.needs_reference:
            return None
        if self.reference is not None:
            return "model"
        return "starting adapter" if self.model_config.adapter is not None else "base"

    def _as_reference(self) -> contextlib.AbstractContextManager[torch.nn.Module]:
        """A context that gives the frozen reference (see ``reference_source``)."""
        if self.reference is not None:
            return contextlib.nullcontext(self.reference)
        return as_reference(self.compute_policy)

    # ----------------------------------------------------------------------------- forward passes

    def _units(self, batch: dict[str, torch.Tensor], indices: torch.Tensor) -> list[torch.Tensor]:
        """``indices`` as the units that stay together (the algorithm's ``micro_batch_groups``; by
        default one row each), in order of first appearance."""
        groups = self.algorithm.micro_batch_groups(batch)
        if groups is None:
            return list(indices.split(1))
        members: dict[int, list[int]] = {}
        for index in indices.tolist():
            members.setdefault(int(groups[index]), []).append(index)
        return [torch.tensor(rows) for rows in members.values()]

    def _micro_batches(self, batch: dict[str, torch.Tensor], indices: torch.Tensor) -> list[torch.Tensor]:
        """Split ``indices`` into micro-batches of whole units: up to ``micro_batch_size`` sequences
        (a larger unit alone), or with packing the units of ``micro_batch_size`` packed rows."""
        size = self.config.micro_batch_size
        units = self._units(batch, indices)
        if not self.config.packing:
            parts: list[list[torch.Tensor]] = []
            for unit in units:
                if not parts or sum(len(u) for u in parts[-1]) + len(unit) > size:
                    parts.append([])
                parts[-1].append(unit)
            return [torch.cat(part) for part in parts]
        lengths = [int(batch["attention_mask"][unit].sum()) for unit in units]
        rows = plan_rows(lengths, self.config.pack_tokens or max(lengths))
        return [torch.cat([units[i] for row in rows[r : r + size] for i in row]) for r in range(0, len(rows), size)]

    def _run(self, part: dict[str, torch.Tensor], call) -> dict[str, torch.Tensor]:
        """Apply ``call(input_ids, attention_mask, target_mask, position_ids)`` to ``part``, packed or
        padded, on the learner's device; returns its per-target outputs there, in ``part``'s padded layout."""
        mask = part[LOSS_MASK]
        device = self.device
        if not self.config.packing:
            return call(part["input_ids"].to(device), part["attention_mask"].to(device), mask.to(device), None)
        lengths = part["attention_mask"].sum(-1)
        rows = plan_rows(
            lengths.tolist(), int(lengths.max()) if not self.config.pack_tokens else self.config.pack_tokens
        )
        packed = pack(part["input_ids"], lengths, mask, rows, self.pad_token_id)
        inputs = (packed.input_ids, packed.attention_mask, packed.target_mask, packed.position_ids)
        out = call(*(tensor.to(device) for tensor in inputs))
        return {key: unpack_targets(value, packed, mask.shape) for key, value in out.items()}

    def _policy_call(self, model: torch.nn.Module, entropy: bool, entropy_graph: bool = False):
        def call(input_ids, attention_mask, target_mask, position_ids):
            return masked_token_outputs(
                model,
                input_ids,
                attention_mask,
                target_mask,
                entropy=entropy,
                entropy_graph=entropy_graph,
                position_ids=position_ids,
            )

        return call

    def _critic_call(self, input_ids, attention_mask, target_mask, position_ids):
        return {VALUES: self.compute_critic(input_ids, attention_mask, target_mask, position_ids)}

    def _shard_rows(self, batch: dict[str, torch.Tensor], rows: torch.Tensor) -> torch.Tensor | None:
        """This learner's share of ``rows``: whole units (so no unit is split across learners), or None."""
        units = self._units(batch, rows)
        mine = [units[i] for i in self.backend.shard(torch.arange(len(units))).tolist()]
        return torch.cat(mine) if mine else None

    def _filler(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """A row whose pass stands in for a micro-batch this learner lacks (one with sampled tokens where there is
        one, so that its loss is finite); its results are multiplied by zero or dropped."""
        sampled = batch[LOSS_MASK].sum(-1).nonzero()[:1, 0]
        return sampled if len(sampled) else torch.tensor([0])

    @torch.no_grad()
    def _score(self, batch: dict[str, torch.Tensor], call, key: str) -> torch.Tensor:
        """``key`` output of ``call`` for every target of ``batch``, micro-batch by micro-batch. -> (B, L-1)

        Each learner scores its share of the rows; the sum over learners fills in the rest."""
        result = torch.zeros_like(batch[LOSS_MASK])
        mine = self._shard_rows(batch, torch.arange(result.shape[0]))
        micro = self._micro_batches(batch, mine) if mine is not None else []
        for k in range(self.backend.most(len(micro))):
            part = select_rows(batch, micro[k] if k < len(micro) else self._filler(batch))
            scores = self._run(part, call)[key]
            if k < len(micro):
                result[micro[k], : part[LOSS_MASK].shape[1]] = scores.to(result.device)
        return self.backend.sum_over_learners(result)

    # ----------------------------------------------------------------------------- update

    def update(self, trajectory_refs: list[ray.ObjectRef]) -> dict[str, float]:
        """One iteration of optimisation on the trajectories behind ``trajectory_refs``; returns metrics."""
        import ray  # imported here so that the learner runs where Ray is not installed (update_batch)

        return self.update_batch(ray.get(trajectory_refs))

    def update_batch(self, trajectories: list[Trajectory]) -> dict[str, float]:
        """One iteration of optimisation (``epochs`` x ``minibatches`` steps); returns metrics. With
        ``offload_optimizer`` the optimizer state comes to the device for it and goes back to host memory after."""
        try:
            if self.offload_optimizer:
                self._move_optimizer_state(self.device, "optimizer state on the device")
            return self._optimise(trajectories)
        finally:
            if self.offload_optimizer:
                self._move_optimizer_state(torch.device("cpu"), "optimizer state offloaded")
            release_free_heap()  # the update's freed activations and gradients, for the samplers' rollout

    def _move_optimizer_state(self, device: torch.device, event: str) -> None:
        moved = self.backend.move_optimizer_state(device)
        if device.type == "cuda" or self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            if device.type == "cpu":
                torch.cuda.empty_cache()  # the freed memory goes back to the samplers sharing the GPU
        self.events.add(event)
        log.debug(event, bytes=moved)

    def timeline(self) -> list[tuple[float, str]]:
        """The latest updates' events with their wall-clock times: ``update``, and with ``offload_optimizer``
        when the optimizer state came and went."""
        return self.events.read()

    def _optimise(self, trajectories: list[Trajectory]) -> dict[str, float]:
        started = time.perf_counter()
        received = len(trajectories)
        trajectories = self.algorithm.select_trajectories(trajectories)
        skipped = {"learner/tokens": 0.0, "learner/trajectories": 0.0, "learner/optimizer_steps": 0.0}
        if not trajectories:
            # e.g. every group's episodes got the same reward: no signal, so no forward or backward at all
            log.info("the algorithm selected no trajectories; no update", received=received)
            return skipped
        batch = self.prepare(trajectories)
        metrics: dict[str, float] = {
            "learner/tokens": float(batch[LOSS_MASK].sum()),
            "learner/trajectories": float(len(trajectories)),
            "learner/advantage_abs_mean": float(masked_mean(batch[ADVANTAGES].abs(), batch[LOSS_MASK])),
        }
        if metrics["learner/tokens"] == 0:
            log.warning("no sampled tokens in batch; skipping update", trajectories=len(trajectories))
            return {**skipped, **metrics}

        step_metrics: list[dict[str, float]] = []
        units = self._units(batch, torch.arange(len(trajectories)))
        for _ in range(self.config.epochs):
            order = torch.randperm(len(units), generator=self.shuffle)
            for minibatch in order.tensor_split(min(self.config.minibatches, len(units))):
                step_metrics.append(self._step(batch, torch.cat([units[i] for i in minibatch.tolist()])))
        self.version += 1
        self.events.add("update")
        for key in step_metrics[0]:
            metrics[key] = sum(m[key] for m in step_metrics) / len(step_metrics)
        metrics["learner/optimizer_steps"] = float(len(step_metrics))
        metrics["learner/lr"] = self.optimizer.param_groups[0]["lr"]
        squares = 0.0  # under ZeRO-3 gathered a bucket at a time, as for publishing
        for bucket in self.backend.gathered_buckets(list(self.policy.parameters()), PUBLISH_BUCKET_BYTES):
            squares += sum(float((p.detach().float() ** 2).sum()) for p in bucket)
        metrics["learner/param_norm"] = squares**0.5
        metrics["time/update_s"] = time.perf_counter() - started
        return metrics

    @property
    def old_logprobs_source(self) -> str:
        """Where ratio denominators come from: ``sampler``, ``recompute`` (a scoring pass before the update)
        or ``forward`` (the training forward's own values, detached; ``learner.old_logprobs: auto`` with one
        optimizer step per batch, where they equal ``recompute``'s without its extra forward)."""
        cfg = self.config
        if not self.algorithm.uses_old_logprobs:
            return "forward"  # nothing reads them but a metric: never worth a forward of their own
        if cfg.old_logprobs != "auto":
            return cfg.old_logprobs
        one_step = cfg.epochs == 1 and cfg.minibatches == 1
        return "forward" if one_step and not self.algorithm.advantages_read_old_logprobs else "recompute"

    def prepare(self, trajectories: list[Trajectory]) -> dict[str, torch.Tensor]:
        """Collate ``trajectories`` and add old/reference log-probabilities, old values and advantages
        (old log-probabilities wait for the training forward when ``old_logprobs_source`` is ``forward``)."""
        batch = collate(trajectories, self.pad_token_id)
        self.compute_policy.eval()
        source = self.old_logprobs_source
        if source == "sampler":
            # Async mode: the data may come from older weights than the learner's, so the ratio's
            # denominator is the sampling policy's own probability (off-policy correction by the clip).
            batch[OLD_LOGPROBS] = batch["sampler_logprobs"].clone()
        elif source == "recompute":
            # Scored by the learner's own weights before any step (the data was sampled by these
            # weights in sync mode); this keeps the ratio exact at any temperature.
            batch[OLD_LOGPROBS] = self._score(batch, self._policy_call(self.compute_policy, False), LOGPROBS)
        if self.algorithm.needs_reference:
            with self._as_reference() as reference:
                batch[REF_LOGPROBS] = self._score(batch, self._policy_call(reference, False), LOGPROBS)
        if self.critic is not None:
            batch[OLD_VALUES] = self._score(batch, self._critic_call, VALUES)
        self.compute_policy.train()
        batch[ADVANTAGES] = self.algorithm.compute_advantages(batch)
        return batch

    def _weight(self, mask: torch.Tensor) -> float:
        """A micro-batch's share unit under the algorithm's aggregation: tokens, or episodes with tokens."""
        if self.algorithm.config.aggregation == "token_mean":
            return float(mask.sum())
        return float((mask.sum(-1) > 0).sum())

    def _step(self, batch: dict[str, torch.Tensor], rows: torch.Tensor) -> dict[str, float]:
        """Accumulate the gradient of minibatch ``rows``, clip it and take one optimizer step."""
        summed = self.accumulate_gradients(batch, rows)
        summed["learner/grad_norm"] = self.backend.step()
        return summed

    def accumulate_gradients(self, batch: dict[str, torch.Tensor], rows: torch.Tensor) -> dict[str, float]:
        """Set ``.grad`` to the gradient of the loss of minibatch ``rows`` of ``prepare``'s batch.

        The loss is reduced over the whole minibatch; this learner back-propagates its shard of the
        rows, micro-batch by micro-batch, each scaled by its share. Returns the loss metrics summed
        over learners.
        """
        total = self._weight(batch[LOSS_MASK][rows])
        self.backend.zero_grad()
        parts = []
        mine = self._shard_rows(batch, rows) if total > 0 else None
        for micro in self._micro_batches(batch, mine) if mine is not None else []:
            part = select_rows(batch, micro)
            share = self._weight(part[LOSS_MASK]) / total
            if share > 0:
                parts.append((part, share))
        # As many passes as the learner with the most (at least one, so that every learner steps together); those
        # this learner lacks run on a filler row with no weight.
        filler = (select_rows(batch, self._filler(batch)), 0.0)
        passes = [*parts, *[filler] * (max(self.backend.most(len(parts)), 1) - len(parts))]
        summed: dict[str, float] = {}
        from_forward = self.old_logprobs_source == "forward"
        for k, (part, share) in enumerate(passes):
            # The entropy is always a metric; its graph is kept only when the loss differentiates it.
            entropy_graph = self.algorithm.differentiates_entropy
            forward_out = self._run(part, self._policy_call(self.compute_policy, True, entropy_graph))
            part = {key: value.to(self.device) for key, value in part.items()}
            if from_forward:
                # One optimizer step per batch: these weights are the ones before the step, so the ratio's
                # denominator is this forward's own value (ratio 1, gradient of the plain policy gradient).
                part[OLD_LOGPROBS] = forward_out[LOGPROBS].detach()
            if self.critic is not None:
                forward_out.update(self._run(part, self._critic_call))
            loss, part_metrics = self.algorithm.compute_loss(part, forward_out)
            part_metrics["learner/sampler_logprob_abs_diff"] = float(
                masked_mean((part[OLD_LOGPROBS] - part["sampler_logprobs"]).abs(), part[LOSS_MASK])
            )
            # Weighting each micro-batch by its share makes the sum the minibatch's loss.
            self.backend.backward(loss * share, last=k == len(passes) - 1)
            part_metrics["learner/loss"] = float(loss.detach())
            for key, value in part_metrics.items():
                summed[key] = summed.get(key, 0.0) + value * share
        return self.backend.sum_metrics(summed)

    # ----------------------------------------------------------------------------- weights, checkpoints

    def publish_weights(self, bucket_bytes: int = PUBLISH_BUCKET_BYTES) -> list[ray.ObjectRef]:
        """Put the current weights in the object store once; returns ``[ref]`` (a list, so Ray passes the ref)
        on rank 0 and ``[]`` elsewhere. Every learner of a group calls it: under ZeRO-3 full weights are gathered
        ``bucket_bytes`` at a time, each bucket copied to host memory on rank 0 and partitioned again before the
        next, so no learner holds more than one bucket beyond its share."""
        import ray

        if self.backend.zero_stage_3 and not is_lora(self.policy):
            payload = self._gathered_payload(bucket_bytes)
            if payload is None:
                return []
        else:
            with self.backend.gathered():
                if self.backend.rank != 0:
                    return []
                payload = self.weights_payload()
        self.published_bytes = payload.num_bytes
        return [ray.put(payload)]

    def _gathered_payload(self, bucket_bytes: int) -> WeightsPayload | None:
        """The full weights as ``weights_payload`` makes them, gathered bucket by bucket (rank 0; None elsewhere)."""
        cast = getattr(torch, self.publish_dtype)
        state = self.policy.state_dict(keep_vars=True)  # a tied weight is one parameter under two names
        params = list({id(p): p for p in state.values() if isinstance(p, torch.nn.Parameter)}.values())
        host: dict[int, torch.Tensor] = {}
        for bucket in self.backend.gathered_buckets(params, bucket_bytes):
            if self.backend.rank == 0:
                for p in bucket:
                    host[id(p)] = p.detach().to(cast).cpu()
        if self.backend.rank != 0:
            return None
        tensors = {
            name: host[id(t)] if isinstance(t, torch.nn.Parameter) else t.detach().cpu() for name, t in state.items()
        }
        return pack_state_dict(tensors, self.version, dtype=self.publish_dtype)

    def weights_payload(self) -> WeightsPayload:
        """The current weights as samplers load them: the float32 master in the samplers' dtype, versioned. A
        LoRA policy publishes its adapter alone (samplers merge it into the base weights they hold)."""
        tensors, lora_scale = self.outgoing_tensors()
        return pack_state_dict(tensors, self.version, dtype=self.publish_dtype, lora_scale=lora_scale)

    def outgoing_tensors(self) -> tuple[dict[str, torch.Tensor], float | None]:
        """``published_tensors`` at least cost, still to be cast to the samplers' dtype: under bf16-mixed, full
        weights published in bfloat16 are the compute copy's own tensors, the master already rounded to
        bfloat16 (no cast and no copy of the model)."""
        if self.mixed is not None and self.publish_dtype == "bfloat16" and not is_lora(self.policy):
            return self.compute_policy.state_dict(), None
        return self.published_tensors()

    def published_tensors(self) -> tuple[dict[str, torch.Tensor], float | None]:
        """What a version publishes, on the learner's device: the full weights, or a LoRA policy's adapter
        and its scale (None for full weights)."""
        if is_lora(self.policy):
            return adapter_state_dict(self.policy), self.lora_scale
        return self.policy_state_dict(), None

    def last_published_bytes(self) -> int:
        """The size of the version ``publish_weights`` put in the object store last (0 before the first)."""
        return self.published_bytes

    def device_identity(self) -> DeviceIdentity:
        """Where this learner's published tensors live: the sending end of a weight sync."""
        return device_identity(self.device)

    def weight_group_address(self) -> tuple[str, int]:
        """Where this learner (rank 0) hosts a weight group: its node's address and a port free there."""
        return free_address()

    def join_weight_group(self, address: GroupAddress) -> None:
        """Join a weight group as its sender (rank 0); blocks until every receiver has joined."""
        self.weight_group = WeightGroup(address, 0, self.device)

    def broadcast_weights(self, bucket_bytes: int) -> int:
        """Broadcast the current weights in the samplers' dtype to the weight group joined last; returns the
        bytes sent (0 on ranks above 0). Every learner of a group calls it (ZeRO-3 gathers the parameters)."""
        with self.backend.gathered():
            if self.backend.rank != 0:
                return 0
            tensors, lora_scale = self.outgoing_tensors()
            cast = getattr(torch, self.publish_dtype)  # a bucket at a time, as it is sent
            return self.weight_group.send(tensors, self.version, lora_scale, bucket_bytes, cast).num_bytes

    def share_weights(self) -> SharedWeights | None:
        """Share the current weights in the samplers' dtype by CUDA IPC with the processes on this learner's GPU;
        returns them on rank 0 (None elsewhere). Every learner of a group calls it (ZeRO-3 gathers the
        parameters).

        Rank 0 keeps the shared tensors, unchanged, until ``release_shared_weights``, which the trainer calls
        once every receiver has loaded them (or failed to).

        Raises:
            ValueError: the weights are not on one CUDA device.
        """
        with self.backend.gathered():
            if self.backend.rank != 0:
                return None
            tensors, lora_scale = self.outgoing_tensors()
            cast = getattr(torch, self.publish_dtype)
            # ZeRO-3 frees gathered parameters when ``gathered`` ends: what is shared then needs its own copy.
            copy = self.config.backend == "deepspeed" and self.config.zero_stage == 3
            shared = {
                name: t.detach().to(cast if t.is_floating_point() else t.dtype, copy=copy)
                for name, t in tensors.items()
            }
            handles = share_cuda_tensors(shared)
            self.shared_tensors = shared
            num_bytes = sum(t.numel() * t.element_size() for t in shared.values())
            return SharedWeights(handles, self.version, lora_scale, num_bytes)

    def release_shared_weights(self) -> None:
        """Let go of the tensors ``share_weights`` shared last (every receiver has loaded them)."""
        self.shared_tensors = None

    @property
    def lora_scale(self) -> float:
        return self.config.lora.alpha / self.config.lora.r

    def policy_state_dict(self) -> dict[str, torch.Tensor]:
        """The policy's full weights under the plain model's names (adapters merged in)."""
        return merged_state_dict(self.policy) if is_lora(self.policy) else self.policy.state_dict()

    def save_checkpoint(self, path: str) -> None:
        """Write ``path/policy`` and ``path/learner.pt`` (optimizer, scheduler, critic, version, RNG states).

        ``policy`` is a Hugging Face model dir, or for a LoRA policy an adapter dir (peft's files and the
        base model's name and weights hash, see ``actors.lora``)."""
        folder = Path(path)
        backend_state = self.backend.save(folder)  # collective under DeepSpeed: every learner calls it
        with self.backend.gathered():
            if self.backend.rank != 0:
                return
            if is_lora(self.policy):  # the trained adapter alone, not a reference adapter beside it
                self.policy.save_pretrained(folder / POLICY_DIR, selected_adapters=[TRAINED_ADAPTER])
            else:
                self.policy.save_pretrained(folder / POLICY_DIR)
        if is_lora(self.policy):
            write_base_model(folder / POLICY_DIR, self.model_config.name)
        self.tokenizer.save_pretrained(folder / POLICY_DIR)
        torch.save(
            {
                **backend_state,
                "critic": self.critic.state_dict() if self.critic is not None else None,
                "version": self.version,
                "torch_rng": torch.get_rng_state(),
                "shuffle_rng": self.shuffle.get_state(),
            },
            folder / LEARNER_STATE,
        )

    def load_checkpoint(self, path: str) -> int:
        """Restore everything ``save_checkpoint`` wrote; returns the weights version."""
        folder = Path(path)
        state = torch.load(folder / LEARNER_STATE, weights_only=False, map_location=self.device)
        with self.backend.gathered(modify=True):
            if is_lora(self.policy):
                # The base stays as loaded (checked against the hash the adapter records); only the adapter is read.
                saved = read_checked_adapter(folder / POLICY_DIR, self.model_config.name)
                load_adapter_state_dict(self.policy, saved.tensors)
            else:
                restored = load_model(str(folder / POLICY_DIR), "float32")
                self.policy.load_state_dict(restored.state_dict())
        self.backend.load(folder, state)
        if self.critic is not None:
            self.critic.load_state_dict(state["critic"])
        if self.mixed is not None:
            self.mixed.copy_weights()
        self.version = state["version"]
        torch.set_rng_state(state["torch_rng"].cpu())
        self.shuffle.set_state(state["shuffle_rng"].cpu())
        if self.offload_optimizer:
            self._move_optimizer_state(torch.device("cpu"), "optimizer state offloaded")
        return self.version

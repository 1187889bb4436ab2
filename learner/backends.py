"""How a learner turns losses into optimizer steps: plain torch, or DeepSpeed ZeRO data parallelism.

Both backends see the same micro-batch losses. Each loss is already scaled to its share of the
*global* minibatch, so the gradient the optimizer applies is the full-batch gradient however the
rows are spread over learners and micro-batches.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from agentgym_rl.learner.precision import BFloat16Compute


def split_buckets(items: list, limit: int, size: Callable[[Any], int]) -> list[list]:
    """``items`` in order, in buckets of at most ``limit`` bytes by ``size`` (an item larger than it alone)."""
    buckets: list[list] = []
    filled = limit
    for item in items:
        if filled + size(item) > limit:
            buckets.append([])
            filled = 0
        buckets[-1].append(item)
        filled += size(item)
    return buckets


class TorchBackend:
    """One process: backward, global-norm clip, AdamW step.

    With ``compute`` (bf16-mixed precision) the losses come from its bfloat16 copy of ``modules``: each
    backward's gradients are moved into ``modules``' float32 ``.grad``, the optimizer steps the float32
    weights, and the step rounds them back into the copy.
    """

    rank = 0
    world_size = 1
    zero_stage_3 = False  # parameters partitioned over learners (ZeRO-3): whole only inside ``gathered``

    def __init__(
        self,
        modules: torch.nn.ModuleDict,
        optimizer,
        scheduler,
        *,
        grad_clip: float,
        compute: BFloat16Compute | None = None,
    ) -> None:
        self.modules = modules
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.grad_clip = grad_clip
        self.compute = compute
        self.backward_passes = 0  # every learner of a group runs as many as the others

    def shard(self, rows: torch.Tensor) -> torch.Tensor:
        """The rows of a minibatch this learner trains on."""
        return rows

    def gathered(self, *, modify: bool = False) -> contextlib.AbstractContextManager:
        """A context in which every parameter is whole on this learner (ZeRO-3 gathers them: every learner
        must enter it together); with ``modify``, what rank 0 writes into them reaches every learner."""
        return contextlib.nullcontext()

    def gathered_buckets(
        self, params: list[torch.nn.Parameter], bucket_bytes: int
    ) -> Iterator[list[torch.nn.Parameter]]:
        """``params`` whole, a bucket at a time where they are partitioned (ZeRO-3); here in one bucket."""
        yield params

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def backward(self, loss: torch.Tensor, *, last: bool) -> None:
        self.backward_passes += 1
        loss.backward()
        if self.compute is not None:
            self.compute.collect_gradients()

    def step(self) -> float:
        """Clip, step, advance the schedule and release the gradients; returns the pre-clip global gradient norm."""
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        norm = float(torch.nn.utils.clip_grad_norm_(params, self.grad_clip))
        self.optimizer.step()
        self.scheduler.step()
        if self.compute is not None:
            self.compute.copy_weights()
        # Freed now, not at the next step's zero_grad: between updates (the rollout, which in colocated mode
        # shares the GPU) they would hold one more copy of the trainable weights.
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def sum_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """Sum each metric over learners (each learner's values are already weighted by its share)."""
        return metrics

    def most(self, count: int) -> int:
        """The largest ``count`` any learner of the group holds (every learner must call it together)."""
        return count

    def sum_over_learners(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` summed over the learners of the group (every learner must call it together)."""
        return tensor

    def move_optimizer_state(self, device: torch.device) -> int:
        """Move the optimizer's state tensors (Adam's moments, ...) to ``device``; returns their bytes. Step
        counters stay where the optimizer keeps them. Under DeepSpeed this is the state of the optimizer
        inside its ZeRO wrapper, the moments of this learner's partition."""
        inner = getattr(self.optimizer, "optimizer", self.optimizer)
        moved = 0
        for state in inner.state.values():
            for key, value in state.items():
                if torch.is_tensor(value) and key != "step":
                    state[key] = value.to(device, non_blocking=True)
                    moved += value.numel() * value.element_size()
        return moved

    def save(self, folder: Path) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def load(self, folder: Path, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])


class DeepSpeedBackend(TorchBackend):
    """``world_size`` learner actors in one process group (gloo on CPUs, NCCL with ``nccl``: learners on GPUs),
    ZeRO stage 0-3 (up to 2 the parameters stay whole on every learner; under 3 each holds a share, and
    ``gathered`` makes them whole for publishing and saving).

    Every learner scores its ``shard`` of the batch and receives the others' scores (so group statistics and
    whitening see every episode), and back-propagates its ``shard`` of each minibatch; DeepSpeed averages
    gradients over learners, which the ``world_size`` factor in ``backward`` turns back into the sum of the
    shares. Every learner runs as many forward and backward passes as the others (``most``): under ZeRO-3 each
    forward gathers parameters from the others, so one pass fewer would meet their collectives with different ones.
    """

    def __init__(
        self,
        modules: torch.nn.ModuleDict,
        optimizer,
        scheduler,
        *,
        grad_clip: float,
        zero_stage: int,
        rank: int,
        world_size: int,
        master_addr: str,
        master_port: int,
        bf16: bool = False,
        nccl: bool = False,
    ) -> None:
        import deepspeed

        os.environ.update(
            MASTER_ADDR=master_addr,
            MASTER_PORT=str(master_port),
            RANK=str(rank),
            WORLD_SIZE=str(world_size),
            LOCAL_RANK="0",
        )
        deepspeed.init_distributed(dist_backend="nccl" if nccl else "gloo")
        self.engine, ds_optimizer, _, ds_scheduler = deepspeed.initialize(
            model=modules,
            optimizer=optimizer,
            lr_scheduler=scheduler,
            config={
                "train_micro_batch_size_per_gpu": 1,
                "gradient_accumulation_steps": 1,
                "gradient_clipping": grad_clip,
                "zero_optimization": {"stage": zero_stage},
                "zero_allow_untested_optimizer": True,
                "steps_per_print": 1 << 30,
                # bf16-mixed: the modules compute in bfloat16, the optimizer keeps float32 master weights.
                "bf16": {"enabled": bf16},
            },
        )
        super().__init__(modules, ds_optimizer, ds_scheduler, grad_clip=grad_clip)
        self.rank = rank
        self.world_size = world_size
        self.zero_stage = zero_stage
        self.zero_stage_3 = zero_stage == 3
        self.nccl = nccl
        self.gathered_peak_bytes = 0

    def gathered(self, *, modify: bool = False) -> contextlib.AbstractContextManager:
        if self.zero_stage < 3:
            return contextlib.nullcontext()
        import deepspeed

        params = list(self.modules.parameters())
        return deepspeed.zero.GatheredParameters(params, modifier_rank=0 if modify else None)

    def gathered_buckets(
        self, params: list[torch.nn.Parameter], bucket_bytes: int
    ) -> Iterator[list[torch.nn.Parameter]]:
        """Under ZeRO-3, ``params`` whole a bucket at a time: each bucket is yielded gathered and partitioned again
        before the next (a parameter larger than ``bucket_bytes`` is a bucket alone); below ZeRO-3, in one bucket.
        ``gathered_peak_bytes`` records the most bytes of the modules' parameters that were whole at once, read
        from DeepSpeed's own status of each parameter. Every learner must iterate it together."""
        if self.zero_stage < 3:
            yield params
            return
        import deepspeed
        from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

        every = list(self.modules.parameters())
        self.gathered_peak_bytes = 0
        for bucket in split_buckets(params, bucket_bytes, lambda p: p.ds_numel * p.element_size()):
            with deepspeed.zero.GatheredParameters(bucket):
                whole = sum(p.ds_numel * p.element_size() for p in every if p.ds_status == ZeroParamStatus.AVAILABLE)
                self.gathered_peak_bytes = max(self.gathered_peak_bytes, whole)
                yield bucket

    def shard(self, rows: torch.Tensor) -> torch.Tensor:
        return rows[self.rank :: self.world_size]

    def zero_grad(self) -> None:
        self.engine.zero_grad()

    def backward(self, loss: torch.Tensor, *, last: bool) -> None:
        # Gradients are reduced over learners once, on the last micro-batch of the minibatch.
        self.backward_passes += 1
        self.engine.set_gradient_accumulation_boundary(last)
        self.engine.backward(loss * self.world_size)
        # The forwards run on the modules, not through the engine, so do what the engine's forward does first:
        # without it ZeRO-3 keeps counting micro-step 0 and each micro-batch's gradient replaces the last's.
        clear = getattr(self.engine.optimizer, "clear_backward_seen_flag", None)
        if clear is not None:
            clear()

    def step(self) -> float:
        self.engine.set_gradient_accumulation_boundary(True)
        self.engine.step()
        norm = self.engine.get_global_grad_norm()
        return float(norm) if norm is not None else 0.0

    def most(self, count: int) -> int:
        counts: list[int] = [0] * self.world_size
        dist.all_gather_object(counts, count)
        return max(counts)

    def sum_over_learners(self, tensor: torch.Tensor) -> torch.Tensor:
        # NCCL reduces tensors on the learner's GPU only; gloo on the CPU.
        device = torch.device("cuda", torch.cuda.current_device()) if self.nccl else torch.device("cpu")
        summed = tensor.to(device, copy=True)
        dist.all_reduce(summed)
        return summed.to(tensor.device)

    def sum_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        gathered: list[dict[str, float]] = [{} for _ in range(self.world_size)]
        dist.all_gather_object(gathered, metrics)
        total: dict[str, float] = {}
        for part in gathered:
            for key, value in part.items():
                total[key] = total.get(key, 0.0) + value
        return total

    def save(self, folder: Path) -> dict:
        self.engine.save_checkpoint(str(folder / "deepspeed"), tag="state")
        return {}

    def load(self, folder: Path, state: dict) -> None:
        self.engine.load_checkpoint(str(folder / "deepspeed"), tag="state")

"""The generation-engine interface shared by samplers and the serving deployment."""

from __future__ import annotations

import abc
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Literal

import torch

from agentgym_rl.actors.engines.serving import BatchServing, Generation, ServingEngine
from agentgym_rl.actors.transport import DeviceIdentity, SharedWeights, device_identity, open_cuda_tensors
from agentgym_rl.actors.weight_sync import GroupAddress, WeightGroup
from agentgym_rl.actors.weights import WeightsPayload, unpack_state_dict
from agentgym_rl.configs.errors import AgentGymError
from agentgym_rl.configs.schema import ModelledEngineConfig, SamplingConfig, VLLMConfig


@dataclass(frozen=True)
class EngineSpec:
    """What every engine is built from: the one argument of :meth:`Engine.build`, whatever the engine.

    An engine reads the fields it needs and ignores the rest.
    """

    model_name: str  # a built-in model name or a local Hugging Face directory
    dtype: Literal["float32", "bfloat16"]  # resolved (never ``auto``)
    seed: int  # seeds the engine's own sampling stream
    stop_token_ids: list[int]  # ids that end a turn
    pad_token_id: int
    max_cached_tokens: int = 0  # keys/values kept between an episode's turns (0: none)
    adapter: str | None = None  # a LoRA adapter directory (base ``model_name``) applied before the first generation
    lora_rank: int | None = None  # a LoRA run's adapter rank (``learner.lora.r``); None: a run of full weights
    vllm: VLLMConfig = field(default_factory=VLLMConfig)  # the vLLM engine's settings
    modelled: ModelledEngineConfig = field(default_factory=ModelledEngineConfig)  # the modelled engine's settings
    fit_cache_to_memory: bool = False  # on a GPU: keep at most what half the memory free after loading holds


class EngineUnavailableError(AgentGymError, RuntimeError):
    """The engine cannot run on this machine (a missing package or device); the message says what to install."""


class UnknownEngineError(AgentGymError, ValueError):
    """An engine name that is not registered, or a ``package.module:Class`` that does not name an engine."""


class Engine(abc.ABC):
    """Generates continuations of token-id prompts; holds one versioned copy of the policy weights.

    Implementations set ``weights_version`` (0 until weights are loaded) and ``stats``, a dict of
    counters with at least ``prefill_tokens`` (prompt ids run through the model) and ``reused_tokens``
    (prompt ids served from cached keys/values instead).
    """

    weights_version: int = 0
    stats: dict[str, int]
    weight_group: WeightGroup | None = None  # the learner's broadcast group, once joined

    @classmethod
    @abc.abstractmethod
    def build(cls, spec: EngineSpec) -> Engine:
        """The engine a sampler generates with (what ``make_engine`` returns for this engine's name).

        Raises:
            EngineUnavailableError: the engine cannot run here.
        """

    @classmethod
    def build_serving(cls, spec: EngineSpec, *, max_rows: int, max_kv_tokens: int, max_requests: int) -> ServingEngine:
        """The engine's serving form for the HTTP endpoint (continuous batching, token streaming); by default
        there is none.

        Args:
            spec: as for :meth:`build`.
            max_rows: most completions decoding at once.
            max_kv_tokens: bound on the running batch's key/value positions (an engine that sizes its own cache
                may ignore it).
            max_requests: requests in flight (decoding or waiting) beyond which new ones are refused.

        Raises:
            EngineUnavailableError: the engine has no serving form, or cannot run here.
        """
        raise EngineUnavailableError(
            f"engine {cls.__qualname__} has no serving form; serve with serve.engine=transformers (or vllm), or "
            "give the engine a build_serving method"
        )

    def serving(self, *, max_rows: int, max_kv_tokens: int, max_requests: int) -> ServingEngine:
        """This engine in serving form, which samplers generate through: requests submitted one at a time, whenever
        each is ready. The shipped engines admit each request into the running batch as it arrives and let it leave
        when its reply is done (continuous batching). This default drives ``generate`` batch by batch
        (:class:`~actors.engines.serving.BatchServing`): requests that wait together form one call. Arguments as
        for :meth:`build_serving`."""
        return BatchServing(self, max_rows=max_rows, max_requests=max_requests)

    @classmethod
    def check_available(cls, setting: str) -> None:
        """Raise :class:`EngineUnavailableError` when this machine lacks what the engine needs (a package), before
        any actor starts; by default nothing is missing.

        Args:
            setting: the setting that chose the engine, e.g. ``serve.engine='vllm'``, for the message.
        """

    @abc.abstractmethod
    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingConfig,
        generators: list[torch.Generator] | None = None,
        keys: list[Hashable | None] | None = None,
    ) -> list[Generation]:
        """Sample one continuation per prompt, in order.

        Args:
            prompts: token ids per row (non-empty).
            sampling: temperature, top-p, top-k, per-turn token cap and stop strings of the whole batch.
            generators: one per prompt; each row draws from its own random stream, so that an
                episode's samples depend on its seed and not on which other episodes share the batch.
                Without them the engine's own seeded stream is used.
            keys: one episode key (or None) per prompt. A row whose prompt extends what its key's
                previous call processed may reuse that work (the results are the same either way);
                call :meth:`release` when the episode ends.

        Raises:
            ValueError: an empty prompt, or ``generators`` / ``keys`` of another length than ``prompts``.
        """

    @abc.abstractmethod
    def release(self, key: Hashable) -> None:
        """Forget what the engine keeps for episode ``key`` (it ended); unknown keys are ignored."""

    def load_weights(self, payload: WeightsPayload) -> None:
        """Replace the policy weights with ``payload`` (from the object store) and adopt its version."""
        self.load_tensors(unpack_state_dict(payload), payload.version, payload.lora_scale)

    @abc.abstractmethod
    def load_tensors(self, tensors: dict[str, torch.Tensor], version: int, lora_scale: float | None) -> None:
        """Replace the policy weights with ``tensors`` (Hugging Face names) and adopt ``version``; with
        ``lora_scale`` set they are LoRA adapter tensors (peft's names) to apply to the base weights."""

    def sleep(self) -> None:
        """Give back what the engine holds on its device while another actor (a colocated learner) uses it;
        ``wake`` takes it again. The weights and their version survive; cached keys/values do not."""

    def wake(self) -> None:
        """Undo ``sleep`` before the next generation."""

    # ----------------------------------------------------------------------------- weight broadcast

    def weight_group_ranks(self, adapter: bool) -> int:
        """How many members of a weight group this engine takes (``adapter``: the run publishes adapters)."""
        return 1

    def join_weight_group(self, address: GroupAddress, rank: int, adapter: bool) -> None:
        """Join a weight group as ``rank`` (and the ranks after it, up to ``weight_group_ranks``); blocks until
        the group has formed."""
        self.weight_group = WeightGroup(address, rank, self.weights_device)

    def weight_group_identities(self, adapter: bool) -> list[DeviceIdentity]:
        """Where each member this engine takes in a weight group holds its tensors, one per
        ``weight_group_ranks``: what the trainer chooses the transport from."""
        return [device_identity(self.weights_device)] * self.weight_group_ranks(adapter)

    def receive_weights(self) -> int:
        """Receive the next version broadcast in the group joined last; returns the bytes received."""
        header = self.weight_group.receive_header()
        buckets = self.weight_group.receive_buckets(header)
        if header.lora_scale is None:
            self.load_buckets(buckets, header.version)
        else:  # an adapter is small and merged whole
            self.load_tensors({name: t for bucket in buckets for name, t in bucket}, header.version, header.lora_scale)
        return header.num_bytes

    def load_buckets(self, buckets: Iterable[list[tuple[str, torch.Tensor]]], version: int) -> None:
        """Replace the full weights with ``buckets`` of (Hugging Face name, tensor), read as they arrive, and adopt
        ``version``. This default gathers them for ``load_tensors``; an engine that can load a bucket before the
        next arrives overrides it, so that no second copy of the whole model is held."""
        self.load_tensors({name: t for bucket in buckets for name, t in bucket}, version, None)

    def load_shared(self, shared: SharedWeights) -> int:
        """Load a version shared by CUDA IPC from a process on this engine's GPU: its tensors are opened in place
        and copied into the engine on the device (never through the host). Returns the bytes. The sender keeps
        the tensors until this returns, so every copy from them has finished by then."""
        tensors = open_cuda_tensors(shared.handles)
        self.load_tensors(tensors, shared.version, shared.lora_scale)
        del tensors
        torch.cuda.synchronize()
        return shared.num_bytes

    @property
    def weights_device(self) -> torch.device:
        """Where received weights land first (the engine's device); a weight group's buffers are there under
        NCCL and on the CPU under gloo (``weight_sync.group_device``)."""
        return torch.device("cpu")

    def close(self) -> None:
        """Free what the engine holds outside this process (vLLM's engine processes); unusable after."""

    @staticmethod
    def check_batch(
        prompts: list[list[int]], generators: list[torch.Generator] | None, keys: list[Hashable | None] | None
    ) -> None:
        """Raise ``ValueError`` for an empty prompt or per-row lists that do not match ``prompts``."""
        empty = [row for row, prompt in enumerate(prompts) if not prompt]
        if empty:
            raise ValueError(f"prompts {empty} are empty; every prompt needs at least one token id")
        for name, values in (("generators", generators), ("keys", keys)):
            if values is not None and len(values) != len(prompts):
                raise ValueError(f"{name} has {len(values)} entries for {len(prompts)} prompts; give one per prompt")

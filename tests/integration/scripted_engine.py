"""An engine that answers every prompt with the same reply: a model-free policy for checking an env, its
rewards and the rollout plumbing. Select it with ``sampler.engine: scripted`` after importing this module."""

from __future__ import annotations

from collections.abc import Hashable

import torch
from typing_extensions import override

from agentgym_rl.actors.engines import Engine, EngineSpec, Generation, register_engine
from agentgym_rl.actors.model_store import load_tokenizer
from agentgym_rl.configs.schema import SamplingConfig


class ScriptedEngine(Engine):
    """Replies ``REPLY`` to every prompt, each token with log-probability 0; holds no weights."""

    REPLY = "turn left"

    def __init__(self, reply_ids: list[int]) -> None:
        self.reply_ids = reply_ids
        self.stats = {"prefill_tokens": 0, "reused_tokens": 0, "replies": 0}

    @classmethod
    @override
    def build(cls, spec: EngineSpec) -> ScriptedEngine:
        tokenizer = load_tokenizer(spec.model_name)
        reply = tokenizer.encode(cls.REPLY, add_special_tokens=False)
        return cls([*reply, spec.stop_token_ids[0]])  # the stop id ends the turn

    @override
    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingConfig,
        generators: list[torch.Generator] | None = None,
        keys: list[Hashable | None] | None = None,
    ) -> list[Generation]:
        self.check_batch(prompts, generators, keys)
        self.stats["prefill_tokens"] += sum(len(prompt) for prompt in prompts)
        self.stats["replies"] += len(prompts)
        ids = self.reply_ids[: sampling.max_new_tokens]
        finish = "stop" if len(ids) == len(self.reply_ids) else "length"
        return [Generation(token_ids=list(ids), logprobs=[0.0] * len(ids), finish_reason=finish) for _ in prompts]

    @override
    def release(self, key: Hashable) -> None:
        """Nothing is kept per episode."""

    @override
    def load_tensors(self, tensors: dict[str, torch.Tensor], version: int, lora_scale: float | None) -> None:
        self.weights_version = version  # no weights: only the version is adopted


register_engine("scripted", ScriptedEngine)

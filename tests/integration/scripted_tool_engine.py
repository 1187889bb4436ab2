"""An engine whose replies are hermes tool calls, chosen by the turn: a model-free policy that calls functions, for
checking the endpoint's function calling and the episode book with tools (tiny-random writes no parseable call).

Every id the endpoint returns and records is one this engine produced, each with log-probability 0 (the scripted
policy puts all its mass on its reply). The reply to a prompt depends on the prompt alone: the number of
assistant turns it opens picks the line of ``SCRIPT``, so a local engine replays exactly what a replica served.
It serves (``serve.engine``) and generates locally; weights are adopted by version only.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Hashable

import torch
from typing_extensions import override

from agentgym_rl.actors.engines import ChoiceDelta, CompletionRequest, Engine, EngineSpec, Generation, ServingEngine
from agentgym_rl.actors.model_store import load_tokenizer
from agentgym_rl.actors.weights import WeightsPayload
from agentgym_rl.configs.schema import SamplingConfig


def hermes_call(name: str, arguments: dict) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n</tool_call>'


# Turn 1 calls one function with an argument, turn 2 two functions at once, turn 3 and later answer in text.
SCRIPT = (
    hermes_call("go_to", {"object": "red ball 1"}),
    f"{hermes_call('turn_left', {})}\n{hermes_call('move_forward', {})}",
    "I have finished.",
)
TURN_OPENING = "<|im_start|>assistant\n"  # the generation prompt of the SmolLM2 (ChatML) template


class ScriptedToolEngine(Engine):
    """Replies ``SCRIPT[k]`` (then the stop id) to a prompt that opens assistant turn ``k + 1``."""

    def __init__(self, tokenizer, stop_id: int) -> None:
        self.tokenizer = tokenizer
        self.replies = [[*tokenizer.encode(text, add_special_tokens=False), stop_id] for text in SCRIPT]
        self.weights_version = 0

    @classmethod
    @override
    def build(cls, spec: EngineSpec) -> ScriptedToolEngine:
        return cls(load_tokenizer(spec.model_name), spec.stop_token_ids[0])

    @classmethod
    @override
    def build_serving(
        cls, spec: EngineSpec, *, max_rows: int, max_kv_tokens: int, max_requests: int
    ) -> ScriptedToolServing:
        return ScriptedToolServing(cls.build(spec), max_requests=max_requests)

    def reply(self, prompt: list[int], max_new_tokens: int) -> Generation:
        turn = self.tokenizer.decode(prompt).count(TURN_OPENING) - 1
        whole = self.replies[min(turn, len(self.replies) - 1)]
        ids = whole[:max_new_tokens]
        return Generation(
            token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop" if len(ids) == len(whole) else "length"
        )

    @override
    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingConfig,
        generators: list[torch.Generator] | None = None,
        keys: list[Hashable | None] | None = None,
    ) -> list[Generation]:
        self.check_batch(prompts, generators, keys)
        return [self.reply(prompt, sampling.max_new_tokens) for prompt in prompts]

    @override
    def release(self, key: Hashable) -> None:
        """Nothing is kept per episode."""

    @override
    def load_tensors(self, tensors: dict[str, torch.Tensor], version: int, lora_scale: float | None) -> None:
        self.weights_version = version


class ScriptedToolServing(ServingEngine):
    """The serving form: each choice's whole reply in one delta."""

    def __init__(self, engine: ScriptedToolEngine, *, max_requests: int) -> None:
        super().__init__(max_requests=max_requests)
        self.engine = engine
        self.generated = 0

    @property
    @override
    def weights_version(self) -> int:
        return self.engine.weights_version

    @property
    @override
    def stats(self) -> dict[str, int]:
        return {**self.admission_stats(), "generated_tokens": self.generated}

    @override
    async def _deltas(self, request: CompletionRequest) -> AsyncIterator[list[ChoiceDelta]]:
        for choice in range(request.n):
            reply = self.engine.reply(request.prompt_ids, request.params.max_new_tokens)
            self.generated += len(reply.token_ids)
            yield [
                ChoiceDelta(
                    choice=choice,
                    token_ids=tuple(reply.token_ids),
                    logprobs=tuple(reply.logprobs),
                    finish_reason=reply.finish_reason,
                )
            ]

    @override
    async def _load(self, payload: WeightsPayload) -> None:
        self.engine.weights_version = payload.version

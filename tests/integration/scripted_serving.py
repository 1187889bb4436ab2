"""A serving engine that writes what the conversation tells it to: the model-free policy of the endpoint's
function-calling tests, which need replies that are (or are not) well-formed tool calls whatever the weights.

The script is the text between the last ``«`` and ``»`` in the prompt (a test puts it in a user message). The
engine continues the prompt with it: where the prompt already ends with the script's start (the endpoint's forced
call prefix), only the rest is sampled. Every reply ends with the stop id; each token has log-probability 0.
Serve with ``serve.engine: tests.integration.scripted_serving:ScriptedServingEngine``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from typing_extensions import override

from agentgym_rl.actors.engines import ChoiceDelta, CompletionRequest, EngineSpec, ServingEngine
from agentgym_rl.actors.model_store import load_tokenizer
from agentgym_rl.actors.weights import WeightsPayload
from tests.integration.scripted_engine import ScriptedEngine

OPEN, CLOSE = "«", "»"
PIECE_TOKENS = 3  # tokens per streamed delta


def script(text: str) -> str:
    """A user message that makes the engine write ``text``."""
    return f"Write this: {OPEN}{text}{CLOSE}"


class ScriptedServing(ServingEngine):
    """Streams each choice's scripted reply in pieces of ``PIECE_TOKENS`` tokens."""

    def __init__(self, spec: EngineSpec, *, max_requests: int) -> None:
        super().__init__(max_requests=max_requests)
        self.tokenizer = load_tokenizer(spec.model_name)
        self.stop_id = spec.stop_token_ids[0]
        self.version = 0
        self.generated = 0

    @property
    @override
    def weights_version(self) -> int:
        return self.version

    @property
    @override
    def stats(self) -> dict[str, int]:
        return {**self.admission_stats(), "generated_tokens": self.generated}

    def reply_ids(self, prompt_ids: list[int]) -> list[int]:
        prompt = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        start = prompt.rfind(OPEN)
        text = prompt[start + 1 : prompt.index(CLOSE, start)] if start >= 0 else "no script"
        done = next((size for size in range(len(text), 0, -1) if prompt.endswith(text[:size])), 0)
        return [*self.tokenizer.encode(text[done:], add_special_tokens=False), self.stop_id]

    @override
    async def _deltas(self, request: CompletionRequest) -> AsyncIterator[list[ChoiceDelta]]:
        full = self.reply_ids(request.prompt_ids)
        ids = full[: request.params.max_new_tokens]
        finish = "stop" if len(ids) == len(full) else "length"
        for choice in range(request.n):
            for at in range(0, len(ids), PIECE_TOKENS):
                piece = tuple(ids[at : at + PIECE_TOKENS])
                last = at + PIECE_TOKENS >= len(ids)
                self.generated += len(piece)
                yield [ChoiceDelta(choice, piece, (0.0,) * len(piece), finish_reason=finish if last else None)]

    @override
    async def _load(self, payload: WeightsPayload) -> None:
        self.version = payload.version


class ScriptedServingEngine(ScriptedEngine):
    """The scripted engine with a serving form (:class:`ScriptedServing`)."""

    @classmethod
    @override
    def build_serving(cls, spec: EngineSpec, *, max_rows: int, max_kv_tokens: int, max_requests: int) -> ServingEngine:
        return ScriptedServing(spec, max_requests=max_requests)

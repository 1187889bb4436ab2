"""OpenAI's legacy completions (``POST /v1/completions``) on the policy endpoint: a raw prompt (text or token ids) in,
the model's continuation out, with no chat template, as evaluation harnesses and older clients call it.

One prompt per request. ``logprobs: N`` returns each sampled token's log-probability and its N likeliest
alternatives (at most 5, OpenAI's bound); ``echo`` puts the prompt before the text. The prompt's own
log-probabilities (``echo`` with ``logprobs``, how harnesses score a given text) are not computed: that is a 400.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Annotated, Any, Literal

from fastapi.responses import StreamingResponse
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, field_validator, model_validator

from agentgym_rl.actors.engines import ChoiceDelta, CompletionRequest
from agentgym_rl.serve.bodies import (
    STOP_SCHEMA,
    Body,
    OptionalWholeNumber,
    StreamOptions,
    TokenId,
    Usage,
    stop_strings,
)
from agentgym_rl.serve.deployment import GenerateResult, StreamStart
from agentgym_rl.serve.errors import APIError, sse_error
from agentgym_rl.serve.policy_api import PolicyAPI, fingerprint, sampling_params, usage_of

MAX_LOGPROBS = 5  # OpenAI's bound on the legacy `logprobs`
DEFAULT_MAX_TOKENS = 16  # OpenAI's default for legacy completions (the server's cap when that is lower)

COMPLETION_RULES = [
    {  # the prompt's own log-probabilities are not computed
        "if": {"properties": {"echo": {"const": True}}, "required": ["echo"]},
        "then": {"properties": {"logprobs": {"type": "null"}}},
    },
    {  # stream_options needs stream
        "if": {"properties": {"stream_options": {"type": "object"}}, "required": ["stream_options"]},
        "then": {"properties": {"stream": {"const": True}}, "required": ["stream"]},
    },
]


def _one_prompt(prompt: Any) -> Any:
    # Before the union is tried: a batch of prompts gets one clear message, not a union's errors.
    if isinstance(prompt, list) and any(isinstance(item, str | list) for item in prompt):
        raise ValueError("one prompt per request (a string or a list of token ids); send a batch as several requests")
    return prompt


class CompletionsRequest(Body):
    """The legacy completions fields this server honours; ``null`` means the default, as in OpenAI's API."""

    model_config = ConfigDict(json_schema_extra={"allOf": COMPLETION_RULES})

    model: str = Field(description="Served model id (see GET /v1/models).")
    prompt: Annotated[
        Annotated[str, Field(min_length=1)] | Annotated[list[TokenId], Field(min_length=1)],
        BeforeValidator(_one_prompt),
    ] = Field(
        description="The text to continue, or its token ids; one prompt per request. No chat template is applied."
    )
    max_tokens: OptionalWholeNumber = Field(
        None, ge=1, description=f"Cap on generated tokens (default {DEFAULT_MAX_TOKENS}, or the server cap if lower)."
    )
    temperature: float | None = Field(
        None, ge=0.0, le=2.0, description="Sampling temperature (default 1); 0 picks the likeliest token."
    )
    top_p: float | None = Field(None, gt=0.0, le=1.0, description="Nucleus sampling mass (default 1).")
    n: OptionalWholeNumber = Field(
        None, ge=1, description="Completions of the prompt (default 1; at most serve.max_n)."
    )
    stop: Annotated[str | list[str] | None, WithJsonSchema(STOP_SCHEMA)] = Field(
        None, description="Up to 4 strings; the text ends before the first one sampled (it is not returned)."
    )
    seed: OptionalWholeNumber = Field(None, description="Same seed, same request: the same completion.")
    logprobs: OptionalWholeNumber = Field(
        None,
        ge=0,
        le=MAX_LOGPROBS,
        description="Return each sampled token's log-probability and this many likeliest alternatives (0-5).",
    )
    echo: bool | None = Field(None, description="Put the prompt before the completion's text (not with logprobs).")
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0, description="As in chat completions.")
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0, description="As in chat completions.")
    stream: bool | None = Field(None, description="Send server-sent events (`data: {...}` chunks, then `[DONE]`).")
    stream_options: StreamOptions | None = Field(None, description="Streaming options.")
    user: str | None = Field(None, description="Accepted for OpenAI compatibility and ignored.")

    @field_validator("stop")
    @classmethod
    def _stops(cls, stop: str | list[str] | None) -> list[str] | None:
        return stop_strings(stop)

    @model_validator(mode="after")
    def _consistent(self) -> CompletionsRequest:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed with stream=true")
        return self


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(description="The sampled tokens' text.")
    token_logprobs: list[float] = Field(description="Their log-probabilities.")
    top_logprobs: list[dict[str, float]] | None = Field(description="Per token, its likeliest alternatives.")
    text_offset: list[int] = Field(description="Where each token starts in the choice's text.")


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: Literal["stop", "length"] | None


class TextCompletion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    system_fingerprint: str = Field(description="`weights-v<N>`: the weights version that served the completion.")
    weights_version: int = Field(description="The weights version that produced every token of every choice.")
    choices: list[CompletionChoice]
    usage: Usage | None = None


class CompletionsAPI:
    """``POST /v1/completions`` on one replica, through the replica's :class:`PolicyAPI`."""

    def __init__(self, api: PolicyAPI) -> None:
        self.api = api
        self.tokenizer = api.chat.tokenizer

    def request(self, body: CompletionsRequest) -> tuple[CompletionRequest, str]:
        """The engine request of ``body`` and its prompt as text, once the model id and every limit are checked."""
        api = self.api
        api.check_model(body.model)
        n = body.n or 1
        if n > api.limits.max_n:
            raise APIError(400, f"n={n} exceeds this server's cap of {api.limits.max_n} (serve.max_n)", param="n")
        if body.echo and body.logprobs is not None:
            raise APIError(
                400,
                "echo with logprobs asks for the prompt's own log-probabilities, which this server does not compute",
                param="echo",
            )
        if isinstance(body.prompt, str):
            ids, text = self.tokenizer.encode(body.prompt), body.prompt
        else:
            vocabulary = len(self.tokenizer)
            unknown = [token for token in body.prompt if token >= vocabulary]
            if unknown:
                raise APIError(
                    400, f"prompt token id {unknown[0]} is outside the vocabulary (0-{vocabulary - 1})", param="prompt"
                )
            ids, text = list(body.prompt), self.tokenizer.decode(body.prompt)
        if not ids:
            raise APIError(400, "the prompt has no tokens", param="prompt")
        if len(ids) > api.limits.max_prompt_tokens:
            raise APIError(
                400,
                f"prompt is {len(ids)} tokens; this server's max_prompt_tokens is {api.limits.max_prompt_tokens}",
                param="prompt",
                code="context_length_exceeded",
            )
        requested = body.max_tokens if body.max_tokens is not None else min(DEFAULT_MAX_TOKENS, api.limits.max_tokens)
        params = sampling_params(
            temperature=body.temperature,
            top_p=body.top_p,
            max_new_tokens=api.token_cap(requested, "max_tokens"),
            stop=body.stop,
            presence_penalty=body.presence_penalty,
            frequency_penalty=body.frequency_penalty,
            top_logprobs=body.logprobs or 0,
        )
        return CompletionRequest(prompt_ids=ids, params=params, n=n, seed=body.seed), text

    async def respond(self, body: CompletionsRequest) -> TextCompletion | StreamingResponse:
        request, prompt_text = self.request(body)
        api = self.api
        await api.require_model()
        if body.stream:
            weights_version, stream = await api.open_stream(request)
            return api.stream_response(self.events(body, request, prompt_text, weights_version, stream), stream)
        result = await api.policy.generate(request)
        return self.completion(body, request, prompt_text, result)

    def completion(
        self, body: CompletionsRequest, request: CompletionRequest, prompt_text: str, result: GenerateResult
    ) -> TextCompletion:
        start = prompt_text if body.echo else ""
        choices = []
        for index, choice in enumerate(result.choices):
            reply = self.api.reply(request)
            reply.push(choice.token_ids)
            logprobs = None
            if body.logprobs is not None:
                logprobs = self.logprobs(choice.token_ids, choice.logprobs, choice.top_logprobs, len(start))
            choices.append(
                CompletionChoice(
                    index=index, text=start + reply.text, logprobs=logprobs, finish_reason=choice.finish_reason
                )
            )
        generated = sum(len(choice.token_ids) for choice in result.choices)
        return TextCompletion(
            id=new_completion_id(),
            created=int(time.time()),
            model=self.api.model_id,
            system_fingerprint=fingerprint(result.weights_version),
            weights_version=result.weights_version,
            choices=choices,
            usage=usage_of(len(request.prompt_ids), generated),
        )

    def logprobs(
        self,
        token_ids: Sequence[int],
        logprobs: Sequence[float],
        tops: Sequence[Sequence[tuple[int, float]]] | None,
        offset: int,
    ) -> CompletionLogprobs:
        """The legacy ``logprobs`` of sampled tokens (the stop token, which has no text, left out), their offsets
        counted from ``offset``."""
        tokens, values, alternatives, offsets = [], [], [], []
        for index, (token, logprob) in enumerate(zip(token_ids, logprobs, strict=True)):
            if token in self.api.hidden_ids:
                continue
            text = self.api.tokens.entry(token)[0]
            tokens.append(text)
            values.append(logprob)
            offsets.append(offset)
            offset += len(text)
            alternatives.append(
                {self.api.tokens.entry(other)[0]: value for other, value in (tops[index] if tops else ())}
            )
        return CompletionLogprobs(tokens=tokens, token_logprobs=values, top_logprobs=alternatives, text_offset=offsets)

    async def events(
        self,
        body: CompletionsRequest,
        request: CompletionRequest,
        prompt_text: str,
        weights_version: int,
        stream: AsyncGenerator[StreamStart | list[ChoiceDelta], None],
    ) -> AsyncIterator[str]:
        """SSE chunks: with ``echo`` the prompt first, then each choice's text as its tokens arrive (with their
        logprobs when asked), its finish, the usage chunk when asked, then ``[DONE]``."""
        ident, created = new_completion_id(), int(time.time())

        def chunk(choices: list[CompletionChoice], used: Usage | None = None) -> str:
            piece = TextCompletion(
                id=ident,
                created=created,
                model=self.api.model_id,
                system_fingerprint=fingerprint(weights_version),
                weights_version=weights_version,
                choices=choices,
                usage=used,
            )
            return f"data: {piece.model_dump_json(exclude_none=True)}\n\n"

        replies = [self.api.reply(request) for _ in range(request.n)]
        offsets = [len(prompt_text) if body.echo else 0] * request.n
        generated = 0
        try:
            if body.echo:
                for index in range(request.n):
                    yield chunk([CompletionChoice(index=index, text=prompt_text, finish_reason=None)])
            async for deltas in stream:
                for delta in deltas:
                    generated += len(delta.token_ids)
                    reply = replies[delta.choice]
                    text = reply.push(delta.token_ids)
                    if delta.finish_reason is not None:
                        text += reply.finish()
                    logprobs = None
                    if body.logprobs is not None:
                        logprobs = self.logprobs(
                            delta.token_ids, delta.logprobs, delta.top_logprobs, offsets[delta.choice]
                        )
                        offsets[delta.choice] += sum(len(token) for token in logprobs.tokens)
                    if text or delta.finish_reason is not None or (logprobs is not None and logprobs.tokens):
                        choice = CompletionChoice(
                            index=delta.choice, text=text, logprobs=logprobs, finish_reason=delta.finish_reason
                        )
                        yield chunk([choice])
            if body.stream_options is not None and body.stream_options.include_usage:
                yield chunk([], usage_of(len(request.prompt_ids), generated))
            yield "data: [DONE]\n\n"
        except Exception as exc:  # noqa: BLE001 -- the status (200) is sent already; the stream ends with the error
            yield sse_error(exc)


def new_completion_id() -> str:
    return f"cmpl-{uuid.uuid4().hex}"

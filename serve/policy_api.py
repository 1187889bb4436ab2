"""What every API's routes do with a request, whatever API it speaks: ``PolicyAPI`` holds the limits, renders
prompts, calls the model replica, decodes and records episode calls; the OpenAI chat-completions handling lives
here too (its request and reply forms), the Anthropic Messages API in ``serve.anthropic_messages``, OpenAI's
Responses API in ``serve.responses_api``.

Failures are raised (``APIError``, validation errors, ``QueueFullError``) and turned into statuses in the shape
of the route's API in ``serve.errors``.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from typing import Annotated, Any, Literal, Protocol, TypeVar

from fastapi import Header, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel
from starlette.types import Receive, Scope, Send

from agentgym_rl.actors import tool_formats
from agentgym_rl.actors.adapters import policy_source
from agentgym_rl.actors.chat import ChatFormat
from agentgym_rl.actors.engines import ChoiceDelta, CompletionRequest, SamplingParams
from agentgym_rl.actors.model_store import load_tokenizer
from agentgym_rl.actors.tool_formats import ToolChat, ToolFormat, ToolFormatError, ToolTemplate
from agentgym_rl.configs.schema import ServeConfig
from agentgym_rl.envs import EnvError, TextEnv, make
from agentgym_rl.envs.registry import names as env_names
from agentgym_rl.envs.tools import Function, ToolCall, function_named
from agentgym_rl.serve.bodies import (
    AssistantMessage,
    AssistantTurn,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Choice,
    ChoiceLogprobs,
    ChunkChoice,
    Delta,
    FunctionCallDelta,
    NamedToolChoice,
    TokenLogprob,
    ToolCallDelta,
    ToolCallOut,
    ToolMessage,
    TopLogprob,
    Usage,
    content_text,
)
from agentgym_rl.serve.deployment import GenerateResult, StreamStart
from agentgym_rl.serve.episodes import Refusal, split_token
from agentgym_rl.serve.errors import APIError, sse_error
from agentgym_rl.serve.text import ReplyText, TokenTexts
from agentgym_rl.serve.tool_replies import (
    NO_TOOLS,
    ToolReply,
    ToolReplyText,
    ToolUse,
    argument_pieces,
    new_call_id,
    tool_reply,
)

Body = TypeVar("Body", bound=BaseModel)
Answer = TypeVar("Answer")
EPISODE_HEADER = "X-Episode-Token"
EpisodeToken = Annotated[str, Header(alias=EPISODE_HEADER, description="The episode's token, `<id>.<secret>`.")]


def sampling_params(
    *,
    temperature: float | None,
    top_p: float | None,
    max_new_tokens: int,
    stop: list[str] | None = None,
    presence_penalty: float | None = None,
    frequency_penalty: float | None = None,
    top_logprobs: int = 0,
    top_k: int | None = None,
) -> SamplingParams:
    """Engine settings for an API request (None: the APIs' default of 1, and no ``top_k``). A temperature or
    ``top_p`` below ``GREEDY_BELOW`` (1e-5), temperature 0 included, is greedy decoding (see ``SamplingParams``)."""
    return SamplingParams(
        temperature=1.0 if temperature is None else temperature,
        top_p=1.0 if top_p is None else top_p,
        top_k=top_k or 0,
        max_new_tokens=max_new_tokens,
        stop=tuple(stop or ()),
        presence_penalty=presence_penalty or 0.0,
        frequency_penalty=frequency_penalty or 0.0,
        top_logprobs=top_logprobs,
    )


class Policy(Protocol):
    """What the routes call on the model replica they run in (``serve.deployment.PolicyModel``)."""

    async def generate(self, request: CompletionRequest) -> GenerateResult: ...

    def generate_stream(self, request: CompletionRequest) -> AsyncGenerator[StreamStart | list[ChoiceDelta], None]: ...

    async def policy(self) -> dict[str, Any]: ...


def fingerprint(weights_version: int) -> str:
    return f"weights-v{weights_version}"


class EpisodeRecorder:
    """Records the reply of one admitted episode call (``call``: its id in the book), or gives the call up."""

    def __init__(self, book: Any, token: str, call: str) -> None:
        self.book, self.token, self.call, self.done = book, token, call, False

    async def record(
        self,
        token_ids: Sequence[int],
        logprobs: Sequence[float],
        weights_version: int,
        finish_reason: str | None,
        content: str | None,
        calls: Sequence[ToolCall] = (),
    ) -> None:
        """Keep the sampled reply: its ids and log-probs, whether the engine cut it (``finish_reason``, the
        engine's), and the reply as the client got it (``content`` and ``calls``, with the ids it returned). A
        refusal from the book raises."""
        answered(
            await self.book.record.remote(
                self.token,
                list(token_ids),
                list(logprobs),
                weights_version,
                finish_reason == "length",
                content,
                call=self.call,
                tool_calls=list(calls),
            )
        )
        self.done = True

    async def abandon(self) -> None:
        """Give the call up (the episode goes back to where it was before it). The book's call is sent before
        the first await, so a caller cancelled meanwhile still releases the episode."""
        self.done = True
        await self.book.abandon.remote(self.token, call=self.call)


def build_act_env(name: str) -> TextEnv:
    """The env ``/v1/act`` parses for, built with its default options (404 where it cannot start so)."""
    try:
        return make(name)
    except EnvError as exc:
        raise APIError(404, str(exc), param="env", code="env_not_found") from exc
    except ValueError as exc:  # the env needs options (e.g. a server address) that /v1/act cannot pass
        raise APIError(
            404,
            f"env {name!r} is not available here: it needs options that /v1/act cannot pass ({exc})",
            param="env",
            code="env_not_available",
        ) from exc


class PolicyAPI:
    """Request handling behind the routes: limits, prompt rendering, generation calls, decoding.

    Args:
        policy: the model replica these routes run in.
        model_id: the id clients name in ``model``.
        source: model name, model directory or adapter directory (its base's tokenizer is read).
        limits: the serve config (token caps, ``n`` cap, body size, API key).
        model_ready: whether the model is loaded (asked until it first says yes; 503 before).
        episodes: the application's ``EpisodeBook`` actor (``serve.deployment.episode_store``); None: the
            endpoint records no episodes (404 on the episode routes).
        tool_format: how tool calls are written in text (``model.tool_format``).
        tool_template: what renders a prompt with functions (``model.tool_template``).
        replica: the id of the replica these routes run in, sent with every response (``X-Replica``); None:
            none sent.
    """

    def __init__(
        self,
        policy: Policy,
        *,
        model_id: str,
        source: str,
        limits: ServeConfig,
        model_ready: Callable[[], Awaitable[bool]],
        episodes: Any = None,
        tool_format: str = "hermes",
        tool_template: ToolTemplate = "auto",
        replica: str | None = None,
    ) -> None:
        self.policy = policy
        self.replica = replica
        self.episodes = episodes
        self.model_id = model_id
        self.limits = limits
        self.model_ready = model_ready
        self.ready = False
        tokenizer = load_tokenizer(policy_source(source)[0])
        self.chat = ChatFormat(tokenizer)
        self.tools = ToolChat(self.chat, tool_formats.tool_format(tool_format), tool_template)
        # Replies read as calls, and those that opened a call that does not parse (returned as text).
        self.counters = {"tool_calls": 0, "unparsed_tool_calls": 0}
        self.tokens = TokenTexts(tokenizer)
        self.hidden_ids = {tokenizer.eos_token_id}  # the stop token ends a reply; it is no part of its text
        self.created = int(time.time())
        self.envs: dict[str, TextEnv] = {}
        self.env_lock = asyncio.Lock()

    @property
    def book(self) -> Any:
        """The episode book's actor (404 where there is none)."""
        if self.episodes is None:
            raise APIError(404, "this endpoint records no episodes", code="episodes_not_recorded")
        return self.episodes

    async def read_body(self, request: Request, schema: type[Body]) -> Body:
        """Read at most ``max_body_bytes`` of the body (413 beyond) and validate it (400 on bad JSON or fields)."""
        limit = self.limits.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise APIError(413, f"request body of {declared} bytes exceeds the limit of {limit} bytes")
        raw = bytearray()
        async for piece in request.stream():
            raw += piece
            if len(raw) > limit:
                raise APIError(413, f"request body exceeds the limit of {limit} bytes")
        if not raw:
            raise APIError(400, "request body is empty; send a JSON object", code="invalid_json")
        return schema.model_validate_json(bytes(raw))

    async def check_key(self, request: Request) -> None:
        """401 unless the request carries the configured key: as ``Authorization: Bearer <key>`` (OpenAI's clients)
        or ``x-api-key: <key>`` (Anthropic's)."""
        # async: FastAPI runs a plain-function dependency in its thread pool, a thread hop per request.
        key = self.limits.api_key
        if key is None:
            return
        if not hmac.compare_digest(sent_key(request).encode(), key.encode()):
            raise APIError(
                401,
                "missing or wrong API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'",
                code="invalid_api_key",
            )

    async def require_model(self) -> None:
        """503 until the model is loaded (asked until it says yes once)."""
        if not self.ready:
            if not await self.model_ready():
                raise APIError(503, "the model is still loading; retry in a few seconds", code="model_loading")
            self.ready = True

    def check_model(self, model: str) -> None:
        """404 unless ``model`` is the id served here."""
        if model != self.model_id:
            raise APIError(
                404, f"model {model!r} is not served here; use {self.model_id!r}", param="model", code="model_not_found"
            )

    def token_cap(self, requested: int | None, param: str) -> int:
        cap = self.limits.max_tokens
        if requested is None:
            return cap
        if requested > cap:
            raise APIError(400, f"{param}={requested} exceeds this server's max_tokens cap of {cap}", param=param)
        return requested

    def prompt(
        self,
        messages: list[dict[str, Any]],
        functions: Sequence[Function] = (),
        prefix: str = "",
        param: str = "messages",
    ) -> list[int]:
        """Ids of ``messages`` with ``functions`` shown (in the tool format), then the generation prompt and the
        reply's forced ``prefix`` (400 when that is over ``max_prompt_tokens``, naming ``param``: the request field
        that holds the conversation)."""
        try:
            ids = self.tools.prompt_ids(messages, functions)
        except ToolFormatError as exc:
            raise APIError(400, str(exc), param=param) from exc
        if prefix:
            ids += self.chat.encode(prefix)
        limit = self.limits.max_prompt_tokens
        if len(ids) > limit:
            raise APIError(
                400,
                f"prompt is {len(ids)} tokens; this server's max_prompt_tokens is {limit}",
                param=param,
                code="context_length_exceeded",
            )
        return ids

    async def env(self, name: str) -> TextEnv:
        """A registered env by name (never a ``module:Class`` path: a request does not choose what is imported),
        one of ``serve.act_envs`` where that is set. It is built on its first call, once, off the event loop:
        some envs take seconds to start a simulator, and other requests go on meanwhile."""
        allowed = self.limits.act_envs
        if name not in env_names() or (allowed is not None and name not in allowed):
            offered = ", ".join(env_names() if allowed is None else allowed)
            where = "registered envs" if allowed is None else "envs this endpoint parses for (serve.act_envs)"
            raise APIError(404, f"unknown env {name!r}; {where}: {offered}", param="env", code="env_not_found")
        async with self.env_lock:
            if name not in self.envs:
                self.envs[name] = await asyncio.to_thread(build_act_env, name)
        return self.envs[name]

    def completion_request(self, body: ChatCompletionRequest, use: ToolUse) -> CompletionRequest:
        """The engine request for a chat body and its tools, after the model id and every limit are checked."""
        params = self.sampling(body)
        prompt = self.prompt(messages_of(body), use.functions, use.prefix)
        return CompletionRequest(prompt_ids=prompt, params=params, n=body.n or 1, seed=body.seed)

    def tool_use(self, body: ChatCompletionRequest) -> ToolUse:
        """What ``body``'s tools ask of the generation (see :meth:`choose_tools`): ``tool_choice`` ``auto`` or
        ``none``, ``required``, or a named function."""
        choice = body.tool_choice or "auto"
        named = isinstance(choice, NamedToolChoice)
        return self.choose_tools(
            functions_of(body),
            "forced" if named or choice == "required" else choice,
            name=choice.function.name if named else None,
            parallel=body.parallel_tool_calls is not False,
            name_param="tool_choice.function.name",
        )

    def choose_tools(
        self,
        functions: list[Function],
        kind: Literal["auto", "none", "forced"],
        *,
        name: str | None = None,
        parallel: bool = True,
        name_param: str,
        call_ids: Callable[[int], str] = new_call_id,
    ) -> ToolUse:
        """What a request's tools ask of its generation, whichever API it speaks (see :class:`ToolUse`): ``auto``
        reads calls where there are functions, ``none`` returns text, ``forced`` puts the format's call opening at
        the reply's start (with ``name``'s name when given); ``call_ids`` names the calls in the API's form.

        Raises:
            APIError: 400 for a forced call without functions, or a ``name`` that is not among them (``name_param``
                says where the request gave it).
        """
        if kind != "forced":
            return ToolUse(functions, parse=bool(functions) and kind == "auto", parallel=parallel, call_ids=call_ids)
        if not functions:
            raise APIError(
                400, "tool_choice makes a call compulsory but the request offers no `tools`", param="tool_choice"
            )
        if name is not None and function_named(functions, name) is None:
            offered = ", ".join(f.name for f in functions)
            raise APIError(
                400, f"tool_choice names function {name!r}, which is not among `tools` ({offered})", param=name_param
            )
        return ToolUse(
            functions, parse=True, prefix=self.format.call_prefix(name), parallel=parallel, call_ids=call_ids
        )

    @property
    def format(self) -> ToolFormat:
        """The tool format replies are read with."""
        return self.tools.format

    def tool_message(self, use: ToolUse, text: str, finish_reason: Literal["stop", "length"]) -> ToolReply:
        """The reply ``text`` (its forced prefix included) as a message: read as calls when ``use`` asks, counted."""
        if not use.parse:
            return ToolReply(text, [], finish_reason)
        return self.counted(tool_reply(self.format, text, finish_reason, parallel=use.parallel, call_ids=use.call_ids))

    def counted(self, reply: ToolReply) -> ToolReply:
        """``reply``, once its calls (or its call that did not parse) are counted in ``/v1/policy``'s stats."""
        self.counters["tool_calls"] += len(reply.calls)
        self.counters["unparsed_tool_calls"] += reply.error is not None
        return reply

    def sampling(self, body: ChatCompletionRequest) -> SamplingParams:
        """The engine settings of a chat body, once its model id, ``n`` and token cap are checked (400/404)."""
        self.check_model(body.model)
        n = body.n or 1
        if n > self.limits.max_n:
            raise APIError(400, f"n={n} exceeds this server's cap of {self.limits.max_n} (serve.max_n)", param="n")
        return sampling_params(
            temperature=body.temperature,
            top_p=body.top_p,
            max_new_tokens=self.token_cap(body.requested_tokens, body.token_field),
            stop=body.stop,
            presence_penalty=body.presence_penalty,
            frequency_penalty=body.frequency_penalty,
            top_logprobs=body.top_logprobs or 0,
        )

    def reply(self, request: CompletionRequest) -> ReplyText:
        return ReplyText(self.chat.decode_reply, request.params.stop)

    def logprobs(
        self, token_ids: tuple[int, ...] | list[int], logprobs: tuple[float, ...] | list[float], tops: tuple | list
    ) -> ChoiceLogprobs:
        """OpenAI's ``logprobs`` of sampled tokens (the stop token, which has no text, left out)."""
        content = []
        for index, (token, logprob) in enumerate(zip(token_ids, logprobs, strict=True)):
            if token in self.hidden_ids:
                continue
            text, raw = self.tokens.entry(token)
            alternatives = []
            for other, other_logprob in tops[index] if tops else ():
                other_text, other_raw = self.tokens.entry(other)
                alternatives.append(TopLogprob(token=other_text, logprob=other_logprob, bytes=other_raw))
            content.append(TokenLogprob(token=text, logprob=logprob, bytes=raw, top_logprobs=alternatives))
        return ChoiceLogprobs(content=content)

    async def complete(self, body: ChatCompletionRequest, request: CompletionRequest, use: ToolUse) -> ChatCompletion:
        return self.completion(body, request, await self.policy.generate(request), use)

    async def episode_call(
        self,
        token: str,
        messages: list[dict[str, Any]],
        params: SamplingParams,
        use: ToolUse,
        seed: int | None,
        answer: Callable[[CompletionRequest, EpisodeRecorder | None], Awaitable[Answer]],
    ) -> Answer:
        """One call of an episode, whichever API it came through: the book builds the prompt from the ids recorded
        so far and ``messages`` (the call's, in the shared form), and ``answer`` generates from that request and
        returns the response, recording the reply's ids and log-probs exactly as sampled through the recorder it
        is given (None: a call served from the client's own history, which no longer matches, records nothing).
        A streamed answer returns its :class:`EventStream`, which records before its last event.

        Everything the request alone decides (model, ``n``, limits, sampling) is checked before this is called;
        from then on every way out that does not record a reply (a refusal, an engine error, the client gone, a
        stream cut) gives the call up, and the episode is as it was before.
        """
        # A forced call's opening is put after the prompt as ids: the book records them, unsampled.
        prefix_ids = self.chat.encode(use.prefix) if use.prefix else []
        # The call's id is chosen here, so a call cancelled before the book answered can still be given up.
        recorder = EpisodeRecorder(self.book, token, uuid.uuid4().hex)
        try:
            prepare = self.book.prepare.remote(
                token,
                messages,
                params.max_new_tokens,
                call=recorder.call,
                functions=use.functions,
                prefix_ids=prefix_ids,
            )
            prepared = answered(await prepare)
            # Keyed by the episode: an engine with a prefix cache keeps this call's prefix for the episode's next.
            key = split_token(token)[0]
            request = CompletionRequest(prompt_ids=prepared.prompt_ids, params=params, seed=seed, key=key)
            recording = recorder if prepared.recorded else None  # a call served from the client's text records none
            recorder.done = recording is None
            return await answer(request, recording)
        except BaseException:
            if not recorder.done:
                await recorder.abandon()
            raise

    async def complete_in_episode(self, token: str, body: ChatCompletionRequest) -> ChatCompletion | StreamingResponse:
        """A chat call of an episode (see :meth:`episode_call`); a streamed one records its reply before the
        stream's last event."""
        if (body.n or 1) != 1:
            raise APIError(400, f"a call of an episode samples one reply; n must be 1 (got {body.n})", param="n")
        params = self.sampling(body)
        use = self.tool_use(body)

        async def answer(
            request: CompletionRequest, recording: EpisodeRecorder | None
        ) -> ChatCompletion | StreamingResponse:
            if body.stream:
                weights_version, stream = await self.open_stream(request)
                return self.event_stream(body, request, weights_version, stream, recording, use)
            result = await self.policy.generate(request)
            completion = self.completion(body, request, result, use)
            if recording is not None:
                choice, message = result.choices[0], completion.choices[0].message
                calls = [
                    ToolCall(id=c.id, name=c.function.name, arguments=json.loads(c.function.arguments))
                    for c in message.tool_calls or ()
                ]
                await recording.record(
                    choice.token_ids,
                    choice.logprobs,
                    result.weights_version,
                    choice.finish_reason,
                    message.content,
                    calls,
                )
            return completion

        return await self.episode_call(token, messages_of(body), params, use, body.seed, answer)

    def completion(
        self, body: ChatCompletionRequest, request: CompletionRequest, result: GenerateResult, use: ToolUse = NO_TOOLS
    ) -> ChatCompletion:
        choices = []
        for index, choice in enumerate(result.choices):
            reply = self.reply(request)
            reply.push(choice.token_ids)
            message = self.tool_message(use, use.prefix + reply.text, choice.finish_reason)
            choices.append(
                Choice(
                    index=index,
                    message=AssistantMessage(
                        content=message.content, tool_calls=[ToolCallOut.of(c) for c in message.calls] or None
                    ),
                    finish_reason=message.finish_reason,
                    logprobs=self.logprobs(choice.token_ids, choice.logprobs, choice.top_logprobs)
                    if body.logprobs
                    else None,
                )
            )
        generated = sum(len(choice.token_ids) for choice in result.choices)
        return ChatCompletion(
            id=f"chatcmpl-{uuid.uuid4().hex}",
            created=int(time.time()),
            model=self.model_id,
            system_fingerprint=fingerprint(result.weights_version),
            weights_version=result.weights_version,
            choices=choices,
            usage=usage_of(len(request.prompt_ids), generated),
        )

    async def open_stream(
        self, request: CompletionRequest
    ) -> tuple[int, AsyncGenerator[StreamStart | list[ChoiceDelta], None]]:
        """Start a streamed generation; returns its weights version once the engine has admitted it (a
        refusal raises here, before any byte of the response is sent)."""
        stream = self.policy.generate_stream(request)
        try:
            start = await anext(stream)
        except BaseException:
            await stream.aclose()
            raise
        return start.weights_version, stream

    def event_stream(
        self,
        body: ChatCompletionRequest,
        request: CompletionRequest,
        weights_version: int,
        stream: AsyncGenerator[StreamStart | list[ChoiceDelta], None],
        recorder: EpisodeRecorder | None = None,
        use: ToolUse = NO_TOOLS,
    ) -> EventStream:
        """The streamed chat response of an admitted generation (see :meth:`stream_response`)."""
        return self.stream_response(self.sse(body, request, weights_version, stream, recorder, use), stream, recorder)

    def stream_response(
        self,
        events: AsyncIterator[str],
        stream: AsyncGenerator[StreamStart | list[ChoiceDelta], None],
        recorder: EpisodeRecorder | None = None,
    ) -> EventStream:
        """The response sending ``events``, made from ``stream``, an admitted generation; however it ends, the
        generation is closed (which frees its rows at the engine's next step) and an episode call without a
        recorded reply is given up."""

        async def release() -> None:
            try:
                await stream.aclose()
            finally:
                if recorder is not None and not recorder.done:
                    await recorder.abandon()

        return EventStream(events, release)

    async def sse(
        self,
        body: ChatCompletionRequest,
        request: CompletionRequest,
        weights_version: int,
        stream: AsyncGenerator[StreamStart | list[ChoiceDelta], None],
        recorder: EpisodeRecorder | None = None,
        use: ToolUse = NO_TOOLS,
    ) -> AsyncIterator[str]:
        """SSE events: a role chunk per choice, a chunk per group of sampled tokens as they arrive, each
        choice's finish, the usage chunk when asked, then ``[DONE]``. With ``recorder`` (an episode's call,
        one choice), the reply is recorded before the usage chunk and ``[DONE]``. Closing the generation is
        :class:`EventStream`'s (see :meth:`event_stream`).

        When ``use`` reads calls, content goes out only as far as it surely is content (up to a call's
        opening); a choice that made calls then sends, per call, a delta with its index, id and name, its
        arguments in pieces, and a last chunk with ``finish_reason: tool_calls``, as OpenAI streams them."""
        ident, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

        def event(choices: list[ChunkChoice], usage: Usage | None = None) -> str:
            chunk = ChatCompletionChunk(
                id=ident,
                created=created,
                model=self.model_id,
                system_fingerprint=fingerprint(weights_version),
                weights_version=weights_version,
                choices=choices,
                usage=usage,
            )
            return f"data: {chunk.model_dump_json(exclude_none=True)}\n\n"

        replies = [self.reply(request) for _ in range(request.n)]
        readers = [ToolReplyText(reply, self.format, use) for reply in replies] if use.parse else None
        generated = 0
        sampled: list[int] = []
        logprobs_sampled: list[float] = []
        finish_reason = engine_finish = None
        read: ToolReply | None = None  # choice 0 read as calls, when ``use`` reads calls
        try:
            for index in range(request.n):
                yield event([ChunkChoice(index=index, delta=Delta(role="assistant", content=""))])
            async for deltas in stream:
                delta: ChoiceDelta
                for delta in deltas:
                    generated += len(delta.token_ids)
                    if recorder is not None:
                        sampled += delta.token_ids
                        logprobs_sampled += delta.logprobs
                        engine_finish = delta.finish_reason or engine_finish
                    reader = replies[delta.choice] if readers is None else readers[delta.choice]
                    text = reader.push(delta.token_ids)
                    finish_reason, calls = delta.finish_reason, []
                    if finish_reason is not None and readers is None:
                        text += replies[delta.choice].finish()
                    elif finish_reason is not None:
                        rest, message = readers[delta.choice].finish(finish_reason)
                        text += rest
                        read = message
                        finish_reason, calls = self.counted(message).finish_reason, message.calls
                    logprobs = None
                    if body.logprobs:
                        logprobs = self.logprobs(delta.token_ids, delta.logprobs, delta.top_logprobs)
                    if text or finish_reason is not None or (logprobs is not None and logprobs.content):
                        choice = ChunkChoice(
                            index=delta.choice,
                            delta=Delta(content=text) if text else Delta(),
                            finish_reason=None if calls else finish_reason,
                            logprobs=logprobs,
                        )
                        yield event([choice])
                    for chunk in call_chunks(delta.choice, calls):
                        yield event([chunk])
            if recorder is not None:
                content, calls = (read.content, read.calls) if read is not None else (replies[0].text, [])
                await recorder.record(sampled, logprobs_sampled, weights_version, engine_finish, content, calls)
            if body.stream_options is not None and body.stream_options.include_usage:
                yield event([], usage_of(len(request.prompt_ids), generated))
            yield "data: [DONE]\n\n"
        except Exception as exc:  # noqa: BLE001 -- the status (200) is sent already; the stream ends with the error
            yield sse_error(exc)


class EventStream(StreamingResponse):
    """Server-sent events whose ``release`` runs however the response ends: finished, failed, or cut by a
    client that went away, even before the first event (an event generator that never started runs no
    ``finally`` of its own, and Starlette does not close one it stopped reading)."""

    def __init__(self, events: AsyncIterator[str], release: Callable[[], Awaitable[None]]) -> None:
        super().__init__(events, media_type="text/event-stream")
        self.release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                await self.body_iterator.aclose()
            finally:
                await self.release()


def sent_key(request: Request) -> str:
    """The API key a request carries: its bearer token, else its ``x-api-key`` header ("" when neither)."""
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer":
        return given.strip()
    return request.headers.get("x-api-key", "").strip()


def client_of(request: Request) -> str:
    """Who a request comes from, for ``serve.episodes.max_open_per_client``: a digest of the bearer key it
    sends (never the key itself) and its address."""
    key = sent_key(request)
    digest = hashlib.sha256(key.encode()).hexdigest()[:16] if key else "no-key"
    return f"{digest}@{request.client.host if request.client is not None else 'unknown'}"


def messages_of(body: ChatCompletionRequest) -> list[dict[str, Any]]:
    """``body``'s messages in the form the tool formats and the episode book read: ``role`` (``developer`` read as
    ``system``) and ``content`` as text (parts joined; None for an assistant message that only made calls), an
    assistant message's ``tool_calls`` as :class:`~agentgym_rl.envs.tools.ToolCall` s, a tool message's
    ``tool_call_id``.

    Raises:
        APIError: 400 for a ``tool`` message that answers none of the calls of the assistant message its run of
            ``tool`` messages follows.
    """
    messages: list[dict[str, Any]] = []
    answerable: list[str] = []  # the ids of the calls the next tool message may answer
    for index, sent in enumerate(body.messages):
        role = "system" if sent.role == "developer" else sent.role
        message: dict[str, Any] = {"role": role, "content": content_text(sent.content)}
        if isinstance(sent, ToolMessage):
            if sent.tool_call_id not in answerable:
                made = f"made {answerable}" if answerable else "made none"
                raise APIError(
                    400,
                    f"messages[{index}] answers tool call {sent.tool_call_id!r}, but the assistant message before it "
                    f"{made}: each `tool` message follows the assistant message whose call (`tool_calls[].id`) it "
                    "answers, or another `tool` message answering it",
                    param=f"messages.{index}.tool_call_id",
                )
            message["tool_call_id"] = sent.tool_call_id
        elif isinstance(sent, AssistantTurn) and sent.tool_calls:
            message["tool_calls"] = [call.call() for call in sent.tool_calls]
            answerable = [call.id for call in sent.tool_calls]
        else:
            answerable = []
        messages.append(message)
    return messages


def functions_of(body: ChatCompletionRequest) -> list[Function]:
    """The functions ``body`` offers (its ``tools``), in order."""
    return [tool.function.function() for tool in body.tools or ()]


def call_chunks(index: int, calls: list[ToolCall]) -> list[ChunkChoice]:
    """Choice ``index``'s calls as OpenAI streams them: per call a delta with its index, id, type and name (and
    empty arguments), then its arguments in pieces; last an empty delta with ``finish_reason: tool_calls``."""
    if not calls:
        return []
    chunks = []
    for position, call in enumerate(calls):
        opening = FunctionCallDelta(name=call.name, arguments="")
        chunks.append(tool_chunk(index, ToolCallDelta(index=position, id=call.id, type="function", function=opening)))
        for piece in argument_pieces(call):
            chunks.append(tool_chunk(index, ToolCallDelta(index=position, function=FunctionCallDelta(arguments=piece))))
    return [*chunks, ChunkChoice(index=index, delta=Delta(), finish_reason="tool_calls")]


def tool_chunk(index: int, delta: ToolCallDelta) -> ChunkChoice:
    return ChunkChoice(index=index, delta=Delta(tool_calls=[delta]))


def answered(answer: Answer | Refusal) -> Answer:
    """``answer``, or the ``APIError`` of the episode book's refusal."""
    if isinstance(answer, Refusal):
        raise APIError(answer.status, answer.message, param=answer.param, code=answer.code)
    return answer


def episode_token(episode_id: str, token: str) -> str:
    """``token`` when it names ``episode_id`` (403 otherwise)."""
    if split_token(token)[0] != episode_id:
        raise APIError(403, f"the {EPISODE_HEADER} header holds another episode's token", code="episode_forbidden")
    return token


def usage_of(prompt_tokens: int, completion_tokens: int) -> Usage:
    return Usage(
        prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, total_tokens=prompt_tokens + completion_tokens
    )

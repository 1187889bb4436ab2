"""The FastAPI ingress: OpenAI-compatible chat routes, /v1/act, /v1/policy and /healthz.

Prompts are rendered and completions decoded here, next to HTTP; the model deployment only
sees token ids. Every failure is an :class:`APIError` (or a pydantic ``ValidationError``) and is
turned into an HTTP status and an OpenAI-style error body in :func:`install_error_handlers`.
"""

from __future__ import annotations

import hmac
import time
import uuid
from collections.abc import AsyncIterator
from typing import TypeVar

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ValidationError
from ray.serve.handle import DeploymentHandle

from actors.chat import ChatFormat
from actors.models import load_tokenizer
from configs.schema import SamplingConfig, ServeConfig
from envs import EnvError, InvalidAction, TextEnv, make
from serve.deployment import GenerateRequest, GenerateResult
from serve.models import (
    ActRequest,
    ActResponse,
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Choice,
    ChunkChoice,
    Delta,
    Health,
    ModelCard,
    ModelList,
    PolicyInfo,
    Usage,
)

Body = TypeVar("Body", bound=BaseModel)


class APIError(Exception):
    """A request the server refuses; ``status`` is the HTTP status, ``message`` says what to change."""

    def __init__(self, status: int, message: str, *, kind: str = "invalid_request_error", param: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.param = param


def _error_response(status: int, message: str, kind: str, param: str | None = None) -> JSONResponse:
    # OpenAI's error shape, so the openai client raises its matching exception with this message.
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(body, status_code=status, headers=headers)


def _describe(errors: list[dict]) -> str:
    parts = []
    for error in errors:
        where = ".".join(str(p) for p in error.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {error['msg']}")
    return "; ".join(parts)


def install_error_handlers(app: FastAPI) -> None:
    """The one place that maps failures to HTTP statuses."""

    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return _error_response(exc.status, exc.message, exc.kind, exc.param)

    @app.exception_handler(ValidationError)
    async def _invalid_body(_: Request, exc: ValidationError) -> JSONResponse:
        return _error_response(422, f"invalid request: {_describe(exc.errors())}", "invalid_request_error")

    @app.exception_handler(RequestValidationError)
    async def _invalid_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        return _error_response(422, f"invalid request: {_describe(list(exc.errors()))}", "invalid_request_error")


def sampling_for(temperature: float, max_new_tokens: int, top_p: float = 1.0) -> SamplingConfig:
    """Engine sampling settings for an API request; temperature 0 means greedy (top-1) decoding."""
    if temperature == 0.0:
        return SamplingConfig(temperature=1.0, top_k=1, top_p=1.0, max_new_tokens=max_new_tokens)
    return SamplingConfig(temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens)


class PolicyAPI:
    """Request handling behind the routes: limits, prompt rendering, generation calls, decoding.

    Args:
        policy: handle of the model deployment.
        model_id: the id clients name in ``model``.
        source: model name or directory the tokenizer is read from.
        limits: the serve config (token caps, body size, API key).
    """

    def __init__(self, policy: DeploymentHandle, *, model_id: str, source: str, limits: ServeConfig) -> None:
        self.policy = policy
        self.model_id = model_id
        self.limits = limits
        self.chat = ChatFormat(load_tokenizer(source))
        self.created = int(time.time())
        self.envs: dict[str, TextEnv] = {}

    async def read_body(self, request: Request, schema: type[Body]) -> Body:
        """Read at most ``max_body_bytes`` of the body (413 beyond) and validate it (422 on bad JSON or fields)."""
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
            raise APIError(422, "request body is empty; send a JSON object")
        return schema.model_validate_json(bytes(raw))

    def check_key(self, request: Request) -> None:
        """401 unless the ``Authorization: Bearer <key>`` header carries the configured key."""
        key = self.limits.api_key
        if key is None:
            return
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), key.encode()):
            raise APIError(
                401, "missing or wrong API key: send 'Authorization: Bearer <key>'", kind="authentication_error"
            )

    def token_cap(self, requested: int | None, param: str) -> int:
        cap = self.limits.max_tokens
        if requested is None:
            return cap
        if requested > cap:
            raise APIError(400, f"{param}={requested} exceeds this server's max_tokens cap of {cap}", param=param)
        return requested

    def prompt(self, messages: list[dict[str, str]]) -> list[int]:
        ids = self.chat.prompt_ids(messages)
        limit = self.limits.max_prompt_tokens
        if len(ids) > limit:
            raise APIError(
                400, f"prompt is {len(ids)} tokens; this server's max_prompt_tokens is {limit}", param="messages"
            )
        return ids

    async def generate(self, prompt_ids: list[int], sampling: SamplingConfig) -> GenerateResult:
        return await self.policy.generate.remote(GenerateRequest(prompt_ids=prompt_ids, sampling=sampling))

    def env(self, name: str) -> TextEnv:
        if name not in self.envs:
            try:
                self.envs[name] = make(name)
            except EnvError as exc:
                raise APIError(404, str(exc), kind="not_found_error", param="env") from exc
            except ValueError as exc:  # the env needs options (e.g. a server address) that /v1/act cannot pass
                raise APIError(400, f"env {name!r} cannot be created without options: {exc}", param="env") from exc
        return self.envs[name]

    async def complete(self, body: ChatCompletionRequest) -> tuple[list[int], GenerateResult]:
        if body.model != self.model_id:
            raise APIError(404, f"model {body.model!r} is not served here; use {self.model_id!r}", param="model")
        cap = self.token_cap(body.requested_tokens, "max_tokens")
        prompt_ids = self.prompt([m.model_dump(exclude={"name"}) for m in body.messages])
        return prompt_ids, await self.generate(prompt_ids, sampling_for(body.temperature, cap, body.top_p))

    async def stream(
        self, body: ChatCompletionRequest, prompt_ids: list[int], result: GenerateResult
    ) -> AsyncIterator[str]:
        """SSE events of a finished completion: a role chunk, one chunk per decoded token, the finish, [DONE]."""
        ident, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())

        def event(choice: ChunkChoice | None, usage: Usage | None = None) -> str:
            chunk = ChatCompletionChunk(
                id=ident, created=created, model=self.model_id, choices=[choice] if choice else [], usage=usage
            )
            return f"data: {chunk.model_dump_json(exclude_none=True)}\n\n"

        yield event(ChunkChoice(index=0, delta=Delta(role="assistant", content="")))
        ids, sent = result.generation.token_ids, ""
        for end in range(1, len(ids) + 1):
            text = self.chat.decode_reply(ids[:end])
            # A token that ends inside a multi-byte character decodes to U+FFFD; wait for the rest of it.
            if text.endswith("\ufffd") and end < len(ids):
                continue
            if len(text) > len(sent):
                yield event(ChunkChoice(index=0, delta=Delta(content=text[len(sent) :])))
                sent = text
        yield event(ChunkChoice(index=0, delta=Delta(), finish_reason=result.generation.finish_reason))
        if body.stream_options is not None and body.stream_options.include_usage:
            yield event(None, _usage(prompt_ids, result))
        yield "data: [DONE]\n\n"


def _usage(prompt_ids: list[int], result: GenerateResult) -> Usage:
    completion = len(result.generation.token_ids)
    return Usage(prompt_tokens=len(prompt_ids), completion_tokens=completion, total_tokens=len(prompt_ids) + completion)


def build_api(api: PolicyAPI) -> FastAPI:
    """The FastAPI app of one ingress replica; every route except /healthz needs the API key when one is set."""
    app = FastAPI(title="agentgym-rl policy", version="1")
    install_error_handlers(app)
    authorised = [Depends(api.check_key)]

    @app.get("/healthz")
    async def healthz() -> Health:
        info = await api.policy.policy.remote()
        return Health(weights_version=info["weights_version"])

    @app.get("/v1/models", dependencies=authorised)
    async def models() -> ModelList:
        return ModelList(data=[ModelCard(id=api.model_id, created=api.created)])

    @app.get("/v1/policy", dependencies=authorised)
    async def policy() -> PolicyInfo:
        return PolicyInfo(model=api.model_id, **await api.policy.policy.remote())

    @app.post("/v1/chat/completions", dependencies=authorised, response_model=None)
    async def chat_completions(request: Request) -> ChatCompletion | StreamingResponse:
        body = await api.read_body(request, ChatCompletionRequest)
        prompt_ids, result = await api.complete(body)
        if body.stream:
            return StreamingResponse(api.stream(body, prompt_ids, result), media_type="text/event-stream")
        return ChatCompletion(
            id=f"chatcmpl-{uuid.uuid4().hex}",
            created=int(time.time()),
            model=api.model_id,
            choices=[
                Choice(
                    index=0,
                    message=AssistantMessage(content=api.chat.decode_reply(result.generation.token_ids)),
                    finish_reason=result.generation.finish_reason,
                )
            ],
            usage=_usage(prompt_ids, result),
        )

    @app.post("/v1/act", dependencies=authorised)
    async def act(request: Request) -> ActResponse:
        body = await api.read_body(request, ActRequest)
        env = api.env(body.env)
        cap = api.token_cap(body.max_tokens, "max_tokens")
        messages = [
            {"role": "system", "content": env.instruction},
            *(m.model_dump(exclude={"name"}) for m in body.history),
            {"role": "user", "content": body.observation},
        ]
        result = await api.generate(api.prompt(messages), sampling_for(body.temperature, cap))
        completion = api.chat.decode_reply(result.generation.token_ids)
        parsed = env.parse_action(completion)
        invalid = isinstance(parsed, InvalidAction)
        return ActResponse(
            action=None if invalid else parsed,
            invalid_reason=parsed.reason if invalid else None,
            completion=completion,
            finish_reason=result.generation.finish_reason,
            weights_version=result.weights_version,
        )

    return app

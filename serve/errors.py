"""The one place where failures become HTTP statuses, in the error shape of the API a route speaks.

Every error body of an OpenAI-shaped route (chat completions, the Responses API, legacy completions and the rest) is
``{"error": {"message", "type", "param", "code"}}``, so the ``openai`` client raises its matching exception
(``BadRequestError`` for 400, ``AuthenticationError`` 401, ``NotFoundError`` 404, ``RateLimitError`` 429,
``InternalServerError`` 5xx) with the message. The Anthropic Messages route (``/v1/messages``) answers in
Anthropic's shape, ``{"type": "error", "error": {"type", "message"}}``, with the same statuses, so the ``anthropic``
client raises its own matching exceptions:

| status | when |
|---|---|
| 400 | invalid JSON, a bad or unknown field (``param`` names it), a limit exceeded (``max_tokens``, ``n``, prompt) |
| 401 | missing or wrong API key |
| 404 | unknown model, env or route |
| 405 | a route called with a method it does not take (``Allow`` names those it takes) |
| 413 | request body over ``serve.max_body_bytes`` |
| 429 | the replica holds its most requests, or the episode book its most (in all, or for this client) |
| 503 | the model is still loading (with ``Retry-After``) |
| 500 | anything else |
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException

from agentgym_rl.actors.engines import QueueFullError

log = structlog.get_logger()

RETRY_AFTER_S = 1
ROUTES = (
    "routes: POST /v1/chat/completions, POST /v1/responses, POST /v1/messages, POST /v1/completions, GET /v1/models, "
    "POST /v1/act, POST /v1/episodes, GET /v1/episodes/{id}, POST /v1/episodes/{id}/reward, GET /v1/policy, "
    "GET /healthz"
)
# What each status means here, for the routes' OpenAPI declarations (the table above).
ERROR_STATUSES = {
    400: "invalid JSON, a bad or unknown field (`param` names it), or a limit exceeded (max_tokens, n, prompt)",
    401: "missing or wrong API key (when the server has one)",
    403: "an episode's token with the wrong secret, or another episode's token",
    404: "unknown model, env, route or episode (never opened, expired, or already trained on)",
    409: "an episode already closed or with a call in progress, or a call or reward that does not fit what the "
    "episode recorded (its conversation so far, its number of turns)",
    413: "request body over serve.max_body_bytes",
    429: "the replica holds its most requests (serve.max_batch_size + serve.max_queued_requests), or the episode "
    "book is full (serve.episodes.max_open) or holds this client's most (serve.episodes.max_open_per_client)",
    500: "anything unexpected",
    503: "the model is still loading (with Retry-After)",
}
TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
}

# Anthropic's error types by status (its API answers 529 where this server answers 503).
ANTHROPIC_TYPES = {**TYPES, 413: "request_too_large", 503: "overloaded_error"}
ANTHROPIC_ROUTES = ("/v1/messages",)


def speaks_anthropic(request: Request) -> bool:
    """Whether ``request`` went to a route that answers in Anthropic's shape."""
    return request.url.path in ANTHROPIC_ROUTES


class APIError(Exception):
    """A request the server refuses; ``status`` is the HTTP status, ``message`` says what to change.

    Args:
        status: HTTP status.
        message: what was wrong and how to fix it.
        param: the request field at fault, if one is.
        code: a short machine-readable reason (``invalid_api_key``, ``model_not_found``, ...).
    """

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code


def error_body(
    status: int, message: str, param: str | None = None, code: str | None = None, *, anthropic: bool = False
) -> dict:
    if anthropic:  # Anthropic's shape has no param or code: the message names the field
        return {"type": "error", "error": {"type": ANTHROPIC_TYPES.get(status, "api_error"), "message": message}}
    return {"error": {"message": message, "type": TYPES.get(status, "server_error"), "param": param, "code": code}}


def error_response(
    status: int,
    message: str,
    param: str | None = None,
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
    *,
    anthropic: bool = False,
) -> JSONResponse:
    """The error answer (in Anthropic's shape when ``anthropic``); ``headers`` go along (a 405's ``Allow``), beside
    those its status implies."""
    headers = dict(headers or {})
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    if status in (429, 503):
        headers["Retry-After"] = str(RETRY_AFTER_S)
    body = error_body(status, message, param, code, anthropic=anthropic)
    return JSONResponse(body, status_code=status, headers=headers)


def sse_error(exc: Exception, *, anthropic: bool = False) -> str:
    """The SSE event that ends a stream whose status (200) has already been sent (Anthropic's ``error`` event
    when ``anthropic``)."""
    body = json.dumps(error_body(500, f"generation failed: {exc}", code="internal_error", anthropic=anthropic))
    return f"event: error\ndata: {body}\n\n" if anthropic else f"data: {body}\n\n"


def _validation(errors: list[dict], *, anthropic: bool = False) -> JSONResponse:
    """400 naming every bad field in the message, the first one as ``param`` and ``code``."""
    parts, params, codes = [], [], []
    for error in errors:
        path = [str(p) for p in error.get("loc", ()) if p != "body"]
        if error["type"] in ("union_tag_invalid", "union_tag_not_found"):  # a message's role: name the role field
            path.append(error["ctx"]["discriminator"].strip("'"))
        where = ".".join(path)
        if error["type"] == "extra_forbidden":
            parts.append(f"unrecognized request argument supplied: {where}")
            codes.append("unrecognized_argument")
        elif error["type"] == "json_invalid":
            parts.append(f"request body is not valid JSON: {error['msg']}")
            codes.append("invalid_json")
        else:
            parts.append(f"{where or 'body'}: {error['msg']}")
            codes.append("invalid_value")
        params.append(where or None)
    return error_response(
        400, "; ".join(parts), params[0] if params else None, codes[0] if codes else None, anthropic=anthropic
    )


def install_error_handlers(app: FastAPI) -> None:
    """Register the mapping above on ``app``."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.param, exc.code, anthropic=speaks_anthropic(request))

    @app.exception_handler(ValidationError)
    async def _invalid_body(request: Request, exc: ValidationError) -> JSONResponse:
        return _validation(exc.errors(), anthropic=speaks_anthropic(request))

    @app.exception_handler(RequestValidationError)
    async def _invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _validation(list(exc.errors()), anthropic=speaks_anthropic(request))

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> JSONResponse:
        anthropic = speaks_anthropic(request)
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}; {ROUTES}"
            return error_response(404, message, code="not_found", anthropic=anthropic)
        # Starlette's own headers go along: a 405 names the methods the route takes in `Allow`.
        where = f"{request.method} {request.url.path}"
        allowed = (exc.headers or {}).get("Allow")
        if exc.status_code == 405 and allowed:
            message = f"{where}: method not allowed; this route takes {allowed}"
            return error_response(405, message, code="method_not_allowed", headers=exc.headers, anthropic=anthropic)
        return error_response(exc.status_code, f"{where}: {exc.detail}", headers=exc.headers, anthropic=anthropic)

    @app.exception_handler(QueueFullError)
    async def _busy(request: Request, exc: Exception) -> JSONResponse:
        return error_response(
            429, f"server busy: {exc}", code="rate_limit_exceeded", anthropic=speaks_anthropic(request)
        )

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("request failed", error=str(exc))
        message = f"internal error: {exc}"
        return error_response(500, message, code="internal_error", anthropic=speaks_anthropic(request))

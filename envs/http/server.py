"""An HTTP server that speaks AgentGym's environment protocol for any registered env.

Common protocol (``protocol="agentgym"``: AgentGym's BabyAI, SciWorld and TextCraft servers):

==========================  ======================  ==================================================
POST /create                no body                 ``{"id": int}`` (ids count up from 0)
POST /reset                 ``{"id", "data_idx"}``  ``{observation, reward, score, deleted, done, info}``
POST /step                  ``{"id", "action"}``    ``{observation, reward, score, done, info}``
GET  /observation?id=       --                      the current observation (a JSON string)
POST /close                 ``{"id"}``              ``true``
==========================  ======================  ==================================================

Deep Search's variant (``protocol="searchqa"``, the default for env ``search``): ``POST /create``
(optional ``{"id": question}``) returns a bare int ``env_idx``; ``/reset {"env_idx", "id"}``
returns the observation string; ``/step {"env_idx", "action"}`` returns ``{observation, reward,
done, info}``; ``GET /observation?env_idx=``; ``/close {"env_idx"}`` returns ``true``.

``score`` is the running sum of rewards of the episode; ``info`` is the env's own step info (an
addition AgentGym's clients ignore). An action the env cannot parse is retried as a bare action
(``Action: <text>``), which is what AgentGym's clients send; ``"verbatim": true`` in a step body
hands the text to the env unchanged.

Errors are JSON ``{"error": message}`` with a 4xx/5xx status: wrong bearer token 401, unknown id
404, bad task id 400, step before reset or after the episode ended 409, action too long 413,
malformed body 422 (400 for bytes that are not JSON text), too many live envs 429, an env that
raised unexpectedly 500, an env that cannot start here (e.g. no Java runtime) 503. Env calls run
in a thread pool, one at a time per env, so a slow env does not stall the others.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import structlog
from fastapi import APIRouter, Body, Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from envs.http.models import (
    CloseRequest,
    ResetRequest,
    SearchCloseRequest,
    SearchCreateRequest,
    SearchResetRequest,
    SearchStepRequest,
    ServerOptions,
    StepRequest,
    default_protocol,
)
from envs.http.service import EnvService, ServerError
from envs.registry import env_class

log = structlog.get_logger()


class AsciiJSONResponse(JSONResponse):
    """JSON with non-ASCII escaped: any text an env echoes back (odd bytes included) stays encodable."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def agentgym_routes(service: EnvService) -> APIRouter:
    """The common AgentGym protocol (module docstring)."""
    router = APIRouter()

    @router.post("/create")
    async def create() -> dict[str, int]:
        return {"id": await service.create()}

    @router.post("/reset")
    async def reset(body: ResetRequest) -> dict[str, Any]:
        text, info = await service.reset(body.id, body.data_idx)
        return {"observation": text, "reward": 0.0, "score": 0.0, "deleted": False, "done": False, "info": info}

    @router.post("/step")
    async def step(body: StepRequest) -> dict[str, Any]:
        return await service.step(body.id, body.action, body.verbatim)

    @router.get("/observation")
    async def observation(env_id: int = Query(alias="id", description="Env id from /create.")) -> str:
        return service.observation(env_id)

    @router.post("/close")
    async def close(body: CloseRequest) -> bool:
        await service.close(body.id)
        return True

    return router


def searchqa_routes(service: EnvService) -> APIRouter:
    """Deep Search's ``env_idx`` variant of the protocol (module docstring)."""
    router = APIRouter()

    @router.post("/create")
    async def create(body: Annotated[SearchCreateRequest | None, Body()] = None) -> int:
        env_idx = await service.create()
        if body is not None and body.id is not None:
            try:
                await service.reset(env_idx, body.id)
            except ServerError:
                await service.close(env_idx)  # the caller never learns this index: free it
                raise
        return env_idx

    @router.post("/reset")
    async def reset(body: SearchResetRequest) -> str:
        text, _ = await service.reset(body.env_idx, body.id)
        return text

    @router.post("/step")
    async def step(body: SearchStepRequest) -> dict[str, Any]:
        result = await service.step(body.env_idx, body.action, body.verbatim)
        result["info"] = {**result["info"], "score": result.pop("score")}
        return result

    @router.get("/observation")
    async def observation(env_idx: int = Query(description="Env index from /create.")) -> str:
        return service.observation(env_idx)

    @router.post("/close")
    async def close(body: SearchCloseRequest) -> bool:
        await service.close(body.env_idx)
        return True

    return router


def build_app(env_name: str, options: dict[str, Any] | None = None, max_envs: int = 64, **server: Any) -> FastAPI:
    """The FastAPI app serving env ``env_name`` over AgentGym's protocol.

    Args:
        env_name: a registered env name.
        options: options for every env instance, validated here (a bad option fails now, not per request).
        max_envs: live env instances allowed at once.
        **server: further ``ServerOptions`` fields (``protocol``, ``max_action_chars``, ``token``).

    Raises:
        EnvError: unknown env name. pydantic.ValidationError: bad options.
    """
    server.setdefault("protocol", default_protocol(env_name))
    config = ServerOptions(env_name=env_name, env_options=options or {}, max_envs=max_envs, **server)
    options_model = getattr(env_class(env_name), "Options", None)
    if options_model is not None:
        options_model(**config.env_options)
    service = EnvService(config)

    async def authorize(request: Request) -> None:
        if config.token is not None and request.headers.get("authorization") != f"Bearer {config.token}":
            raise ServerError(401, "missing or wrong bearer token (header 'Authorization: Bearer <token>')")

    app = FastAPI(
        title=f"agentgym-rl env server: {env_name}",
        default_response_class=AsciiJSONResponse,
        dependencies=[Depends(authorize)],
    )
    app.state.service = service
    # Every error leaves through these handlers, as {"error": message} with its status.

    @app.exception_handler(ServerError)
    async def _server_error(request: Request, exc: ServerError) -> JSONResponse:
        return AsciiJSONResponse({"error": exc.message}, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err.get('loc', ()))}: {err.get('msg', '')}" for err in exc.errors()
        )
        return AsciiJSONResponse({"error": f"malformed request: {problems}"}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return AsciiJSONResponse({"error": str(exc.detail)}, status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Starlette still logs the traceback; the client gets JSON like every other error.
        return AsciiJSONResponse({"error": f"internal error: {type(exc).__name__}: {exc}"}, status_code=500)

    routes = searchqa_routes if config.protocol == "searchqa" else agentgym_routes
    app.include_router(routes(service))

    @app.get("/")
    async def root() -> dict[str, Any]:
        return {
            "env": env_name,
            "protocol": config.protocol,
            "live_envs": len(service.sessions),
            "max_envs": config.max_envs,
        }

    return app


def serve(
    env_name: str,
    *,
    host: str = "127.0.0.1",
    port: int = 36001,
    max_envs: int = 64,
    options: dict[str, Any] | None = None,
    token: str | None = None,
    protocol: str | None = None,
) -> None:
    """Build the app for ``env_name`` and serve it with uvicorn until interrupted (blocks)."""
    import uvicorn

    protocol = protocol or default_protocol(env_name)
    app = build_app(env_name, options=options, max_envs=max_envs, token=token, protocol=protocol)
    log.info("env server", env=env_name, url=f"http://{host}:{port}", protocol=protocol, max_envs=max_envs)
    uvicorn.run(app, host=host, port=port, log_level="warning")

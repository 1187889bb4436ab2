"""An HTTP server that speaks AgentGym's environment protocol for any registered env.

Each of AgentGym's env servers answers in its own shapes; ``protocol`` picks which one this server
reproduces (by default the one of the AgentGym server that mirrors the env: see
``envs.http.models.default_protocol``). Bodies are read as AgentGym's FastAPI models read them:
ids may be strings of digits, unknown fields are ignored.

=========  ===================================  ==================================================
protocol   requests                             responses
=========  ===================================  ==================================================
agentgym   ``/create`` (no body)                ``{"id"}`` (ids count up from 0, never reused)
(BabyAI)   ``/reset {id, data_idx}``            ``{observation, reward, score, deleted, done}``
           ``/step {id, action}``               ``{observation, reward, score, done}``
           ``GET /observation?id=``             ``{observation, reward, score, done, deleted}``
           ``/close {id}``                      ``true`` (``false`` for an id closed already)
textcraft  ``/create [{commands, goal}]``       ``{id, observation, done, reward}``: reset to task
                                                ``data_idx = id`` (wrapped), or to the given goal
           ``/reset {id, data_idx=0}``          ``{id, observation, done, reward}``
           ``/step {id, action}``               ``{observation, reward, done}``
           ``GET /observation|commands|goal``   the episode's observation, listing, goal (strings)
           ``/close {id}``                      as agentgym
sciworld   ``/create``, ``/close`` as agentgym
           ``/reset {id, data_idx}``            ``{task_name, var_num, task_description,
                                                observation, reward, score, deleted, done}``
           ``/step {id, action}``               ``{observation, reward, score, done}``, 0-100 scale
           ``GET /observation?id=``             the last answer's ``observation`` (string)
searchqa   ``/create [{id}]``                   a bare int ``env_idx`` (reset to question ``id``)
           ``/reset {env_idx, id}``             the observation (string)
           ``/step {env_idx, action}``          ``{observation, reward, done, info}``
           ``GET /observation?env_idx=``        the observation (string)
           ``/close {env_idx}``                 ``true`` (``false`` for an index closed already)
webarena   ``/create`` (no body)                ``{"env_idx"}``
           ``/reset {env_idx, seed, idx}``      ``{observation, sites, object}`` (object: the intent)
           ``/step {env_idx, action}``          ``{observation, reward, terminated, truncated, info}``
           ``GET /observation?env_idx=``        the observation (string)
           ``/close {env_idx}``                 ``{"closed": "closed"}`` (also a second time)
=========  ===================================  ==================================================

``score`` is the running sum of the episode's rewards (SciWorld: x100, the simulator's 0-100
score); ``info`` (the env's own step info; ``score`` inside it for searchqa) is added to every
reset and step answer, which AgentGym's clients ignore. An action the env cannot parse is retried
as a bare action (``Action: <text>``), which is what AgentGym's clients send; ``"verbatim": true``
in a step body hands the text to the env unchanged.

Errors are JSON ``{"error": message}`` with a 4xx/5xx status, never 200: wrong bearer token 401,
unknown or closed id or a task the env does not have 404, step before reset or after the episode ended 409,
action too long 413, a body that is not UTF-8 JSON text 400, a missing or mistyped field 422, too many live envs
429, an env that raised unexpectedly 500, an env that cannot start here (e.g. no Java runtime) 503.
Env calls run in a thread pool, one at a time per env, so a slow env does not stall the others.
"""

from __future__ import annotations

import hmac
import json
from typing import Any

import structlog
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from agentgym_rl.envs.http.models import ERROR_RESPONSES, ServerOptions, default_protocol
from agentgym_rl.envs.http.routes import ROUTES, declare_links
from agentgym_rl.envs.http.service import EnvService, ServerError
from agentgym_rl.envs.registry import env_class

log = structlog.get_logger()


class AsciiJSONResponse(JSONResponse):
    """JSON with non-ASCII escaped: any text an env echoes back (odd bytes included) stays encodable."""

    def render(self, content: Any) -> bytes:
        return json.dumps(content, ensure_ascii=True, separators=(",", ":")).encode("ascii")


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
        if config.token is None:
            return
        given = request.headers.get("authorization", "").encode()
        if not hmac.compare_digest(given, f"Bearer {config.token}".encode()):  # in constant time
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
        # Starlette's own headers go along (a 405 names the methods the route takes in `Allow`).
        message = str(exc.detail)
        allowed = (exc.headers or {}).get("Allow")
        if exc.status_code == 405 and allowed:
            message = f"{request.method} {request.url.path}: method not allowed; this route takes {allowed}"
        return AsciiJSONResponse({"error": message}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Starlette still logs the traceback; the client gets JSON like every other error.
        return AsciiJSONResponse({"error": f"internal error: {type(exc).__name__}: {exc}"}, status_code=500)

    app.include_router(ROUTES[config.protocol](service), responses=ERROR_RESPONSES)
    default_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        """The schema with the links between the routes and, when the server has a token, the token every route
        needs (clients and Schemathesis read both)."""
        if app.openapi_schema is None:
            schema = declare_links(default_openapi(), config.protocol)
            if config.token is not None:
                schema.setdefault("components", {})["securitySchemes"] = {
                    "bearer": {"type": "http", "scheme": "bearer"}
                }
                schema["security"] = [{"bearer": []}]
        return app.openapi_schema

    app.openapi = openapi

    @app.get("/", responses=ERROR_RESPONSES)
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

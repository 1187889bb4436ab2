"""The routes of each AgentGym server shape, over one ``EnvService``.

Each builder returns the five routes (``/create``, ``/reset``, ``/step``, ``GET /observation``,
``/close``) with the request bodies and response fields of one AgentGym server, as its client
(``agentenv.envs.*``) sends and reads them; ``info`` (the env's own step info) is this project's
addition, which AgentGym's clients ignore. ``envs.http.server`` documents the shapes in a table.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Body, Query, Request, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

from agentgym_rl.envs.base import TextEnv
from agentgym_rl.envs.http.models import (
    SCIWORLD_SCALE,
    CloseRequest,
    EnvIdxCloseRequest,
    EnvIdxStepRequest,
    ResetRequest,
    SearchCreateRequest,
    SearchResetRequest,
    StepRequest,
    TextCraftCreateRequest,
    TextCraftResetRequest,
    WebArenaResetRequest,
)
from agentgym_rl.envs.http.service import EnvService, ServerError

if TYPE_CHECKING:
    from agentgym_rl.envs.textcraft import TextCraftEnv


class JSONTextRequest(Request):
    """A request whose body is read as JSON text (RFC 8259): UTF-8 that parses, else 400 naming what is wrong.
    ``json.loads`` alone would also read UTF-16 and UTF-32 bodies, and FastAPI answers JSON that does not parse
    with 422, the status this server keeps for a well-formed body with a missing or mistyped field."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            try:
                self._json = json.loads(body.decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise HTTPException(400, f"the body is not UTF-8 JSON text: byte {exc.start} is not UTF-8") from exc
            except json.JSONDecodeError as exc:
                raise HTTPException(400, f"the body is not JSON: {exc}") from exc
            except RecursionError as exc:
                raise HTTPException(400, "the body is not JSON this server reads: it nests too deep") from exc
        return self._json


class JSONTextRoute(APIRoute):
    """A route that reads its body with :class:`JSONTextRequest`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def read_json_text(request: Request) -> Response:
            return await handler(JSONTextRequest(request.scope, request.receive))

        return read_json_text


def _router() -> APIRouter:
    return APIRouter(route_class=JSONTextRoute)


def agentgym_routes(service: EnvService) -> APIRouter:
    """The common protocol, in the shapes of AgentGym's BabyAI server."""
    router = _router()

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
    async def observation(env_id: int = Query(alias="id", description="Env id from /create.")) -> dict[str, Any]:
        episode = service.episode(env_id)
        return {
            "observation": episode.observation,
            "reward": episode.reward,
            "score": episode.score,
            "done": episode.done,
            "deleted": False,
        }

    _close_route(router, service)

    return router


def textcraft_routes(service: EnvService) -> APIRouter:
    """AgentGym's TextCraft server: ``/create`` answers with the first observation, ``/commands`` and
    ``/goal`` read the running episode."""
    router = _router()

    @router.post("/create")
    async def create(body: Annotated[TextCraftCreateRequest | None, Body()] = None) -> dict[str, Any]:
        custom = body is not None and (body.commands is not None or body.goal is not None)
        if custom and (body.commands is None or body.goal is None):
            raise ServerError(
                422, "malformed request: give both `commands` and `goal` (one episode of yours) or neither"
            )
        env_id = await service.create()
        try:
            if custom:
                goal, commands = body.goal, body.commands
                text, info = await service.begin(
                    env_id, lambda env: _textcraft(env).reset_to_goal(goal, commands), f"goal {goal!r}"
                )
            else:
                # As AgentGym's server does: the new env starts task `data_idx = id` (wrapped around the tasks).
                tasks = await service.task_ids(env_id)
                text, info = await service.reset(env_id, tasks[env_id % len(tasks)])
        except ServerError:
            await service.close(env_id)  # the caller never learns this id: free it
            raise
        return {"id": env_id, "observation": text, "done": False, "reward": 0, "info": info}

    @router.post("/reset")
    async def reset(body: TextCraftResetRequest) -> dict[str, Any]:
        text, info = await service.reset(body.id, body.data_idx)
        return {"id": body.id, "observation": text, "done": False, "reward": 0, "info": info}

    @router.post("/step")
    async def step(body: StepRequest) -> dict[str, Any]:
        result = await service.step(body.id, body.action, body.verbatim)
        return {key: result[key] for key in ("observation", "reward", "done", "info")}

    _text_observation_route(router, service, "id")

    @router.get("/commands")
    async def commands(env_id: int = Query(alias="id", description="Env id from /create.")) -> str:
        return _textcraft(service.episode(env_id).env).commands

    @router.get("/goal")
    async def goal(env_id: int = Query(alias="id", description="Env id from /create.")) -> str:
        return _textcraft(service.episode(env_id).env).goal

    _close_route(router, service)

    return router


def sciworld_routes(service: EnvService) -> APIRouter:
    """AgentGym's SciWorld server: ``/reset`` names the task, reward and score are on the 0-100 scale."""
    router = _router()

    @router.post("/create")
    async def create() -> dict[str, int]:
        return {"id": await service.create()}

    @router.post("/reset")
    async def reset(body: ResetRequest) -> dict[str, Any]:
        text, info = await service.reset(body.id, body.data_idx)
        description = str(info.get("task_description", ""))
        # AgentGym's client shows `task_description + "\n" + observation`: the observation is what follows.
        look = text.removeprefix(f"{description}\n") if description else text
        # As AgentGym's server, GET /observation answers the look alone until the first step (no await since the
        # reset, so no step of this env ran in between).
        service.episode(body.id).observation = look
        return {
            "task_name": info.get("task_name", ""),
            "var_num": info.get("variation", 0),
            "task_description": description,
            "observation": look,
            "reward": 0,
            "score": 0,
            "deleted": False,
            "done": False,
            "info": info,
        }

    @router.post("/step")
    async def step(body: StepRequest) -> dict[str, Any]:
        result = await service.step(body.id, body.action, body.verbatim)
        # Rounded: the env's rewards are whole score points / 100, which x100 gives back only up to round-off.
        result["reward"] = round(result["reward"] * SCIWORLD_SCALE, 6)
        result["score"] = round(result["score"] * SCIWORLD_SCALE, 6)
        return result

    _text_observation_route(router, service, "id")

    _close_route(router, service)

    return router


def searchqa_routes(service: EnvService) -> APIRouter:
    """Deep Search's ``env_idx`` variant (AgentGym's SearchQA server)."""
    router = _router()

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
    async def step(body: EnvIdxStepRequest) -> dict[str, Any]:
        result = await service.step(body.env_idx, body.action, body.verbatim)
        result["info"] = {**result["info"], "score": result.pop("score")}
        return result

    _text_observation_route(router, service, "env_idx")

    @router.post("/close")
    async def close(body: EnvIdxCloseRequest) -> bool:
        return await service.close(body.env_idx)

    return router


def webarena_routes(service: EnvService) -> APIRouter:
    """AgentGym's WebArena server: ``env_idx`` bodies, ``/reset {env_idx, seed, idx}``, ``terminated`` and
    ``truncated`` instead of ``done``."""
    router = _router()

    @router.post("/create")
    async def create() -> dict[str, int]:
        return {"env_idx": await service.create()}

    @router.post("/reset")
    async def reset(body: WebArenaResetRequest) -> dict[str, Any]:
        text, info = await service.reset(body.env_idx, body.idx)
        return {"observation": text, "sites": info.get("sites", []), "object": info.get("intent", ""), "info": info}

    @router.post("/step")
    async def step(body: EnvIdxStepRequest) -> dict[str, Any]:
        result = await service.step(body.env_idx, body.action, body.verbatim)
        # AgentGym's client stops on `terminated`: an episode the env ended for any reason is terminated.
        truncated = bool(result["info"].get("truncated", False))
        return {
            "observation": result["observation"],
            "reward": result["reward"],
            "terminated": result["done"],
            "truncated": truncated,
            "info": result["info"],
        }

    _text_observation_route(router, service, "env_idx")

    @router.post("/close")
    async def close(body: EnvIdxCloseRequest) -> dict[str, str]:
        await service.close(body.env_idx)
        return {"closed": "closed"}  # also for a second close, as AgentGym's server answers

    return router


def _text_observation_route(router: APIRouter, service: EnvService, id_name: str) -> None:
    """``GET /observation?<id_name>=N``: the running episode's observation text."""

    @router.get("/observation")
    async def observation(env_id: int = Query(alias=id_name, description="Env id from /create.")) -> str:
        return service.episode(env_id).observation


def _close_route(router: APIRouter, service: EnvService) -> None:
    """``POST /close {id}``: true, or false for an env closed already."""

    @router.post("/close")
    async def close(body: CloseRequest) -> bool:
        return await service.close(body.id)


def _textcraft(env: TextEnv) -> TextCraftEnv:
    """``env`` as a TextCraft env (for its own goal, commands); 400 for any other env."""
    from agentgym_rl.envs.textcraft import TextCraftEnv  # only a textcraft server needs the recipe book

    if not isinstance(env, TextCraftEnv):
        raise ServerError(
            400, f"this server's env is {env.name!r}; `commands`, `goal` and /commands, /goal need textcraft"
        )
    return env


ROUTES: dict[str, Callable[[EnvService], APIRouter]] = {
    "agentgym": agentgym_routes,
    "textcraft": textcraft_routes,
    "sciworld": sciworld_routes,
    "searchqa": searchqa_routes,
    "webarena": webarena_routes,
}
# How each protocol's /create answer names the new env (an OpenAPI runtime expression), and the field that
# names it in every later request.
CREATED_ID: dict[str, tuple[str, str]] = {
    "agentgym": ("id", "$response.body#/id"),
    "textcraft": ("id", "$response.body#/id"),
    "sciworld": ("id", "$response.body#/id"),
    "searchqa": ("env_idx", "$response.body"),
    "webarena": ("env_idx", "$response.body#/env_idx"),
}


def declare_links(schema: dict[str, Any], protocol: str) -> dict[str, Any]:
    """``schema`` (the app's OpenAPI) with links from ``/create`` and ``/reset`` to every route that names an env:
    the id ``/create`` answers (or ``/reset`` was sent) is the one the others take. Clients generated from the
    schema, and Schemathesis's stateful phase, follow them from one request to the next."""
    name, created = CREATED_ID[protocol]
    paths = schema["paths"]

    def links(expression: str) -> dict[str, Any]:
        targets = {}
        for path, operations in paths.items():
            for method, operation in operations.items():
                if path == "/create":
                    continue
                ref = f"#/paths/{path.replace('/', '~1')}/{method}"
                if method == "get" and any(p["name"] == name for p in operation.get("parameters", [])):
                    targets[f"{method}{path}"] = {"operationRef": ref, "parameters": {f"query.{name}": expression}}
                elif "requestBody" in operation:
                    targets[f"{method}{path}"] = {"operationRef": ref, "requestBody": {name: expression}}
        return targets

    paths["/create"]["post"]["responses"]["200"]["links"] = links(created)
    paths["/reset"]["post"]["responses"]["200"]["links"] = links(f"$request.body#/{name}")
    return schema

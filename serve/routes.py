"""The HTTP routes of a model replica: OpenAI's chat completions, Responses API and legacy completions, the Anthropic
Messages API, /v1/act, /v1/episodes, /v1/policy and /healthz, and the OpenAPI schema they declare.

Prompts are rendered and completions decoded by ``PolicyAPI`` (``serve.policy_api``); the replica's engine only
sees token ids and streams back what it samples.
"""

from __future__ import annotations

from fastapi import Depends, FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import StreamingResponse
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from agentgym_rl.actors.engines import CompletionRequest
from agentgym_rl.envs import InvalidAction
from agentgym_rl.envs.registry import names as env_names
from agentgym_rl.serve.anthropic_bodies import AnthropicError, MessageOut, MessagesRequest
from agentgym_rl.serve.anthropic_messages import MessagesAPI
from agentgym_rl.serve.bodies import (
    ActRequest,
    ActResponse,
    ChatCompletion,
    ChatCompletionRequest,
    EpisodeInfo,
    EpisodeOpened,
    EpisodeOpenRequest,
    EpisodeReward,
    ErrorResponse,
    Health,
    ModelCard,
    ModelList,
    PolicyInfo,
    ReplicaCache,
)
from agentgym_rl.serve.completions import CompletionsAPI, CompletionsRequest, TextCompletion
from agentgym_rl.serve.episodes import token_of
from agentgym_rl.serve.errors import ERROR_STATUSES, install_error_handlers
from agentgym_rl.serve.policy_api import (
    EPISODE_HEADER,
    EpisodeToken,
    PolicyAPI,
    answered,
    client_of,
    episode_token,
    sampling_params,
)
from agentgym_rl.serve.responses_api import ResponsesAPI
from agentgym_rl.serve.responses_bodies import ResponseOut, ResponsesRequest


def declare_limits(schemas: dict, api: PolicyAPI) -> None:
    """Write what this server accepts into its request schemas: the served model id, the registered envs,
    the caps (``serve.max_tokens``, ``max_n``) and the episodes' reward range. Other values get 400 or 404,
    so a client reading the schema should know them."""
    limits = api.limits
    schemas["ChatCompletionRequest"]["properties"]["model"]["enum"] = [api.model_id]
    schemas["ActRequest"]["properties"]["env"]["enum"] = env_names()

    def bound(model: str, field: str, **bounds: float) -> None:
        declared = schemas[model]["properties"][field]
        for branch in declared.get("anyOf", [declared]):
            target = branch.get("items", branch) if branch.get("type") == "array" else branch
            if target.get("type") in ("integer", "number"):
                target.update(bounds)

    schemas["MessagesRequest"]["properties"]["model"]["enum"] = [api.model_id]
    schemas["ResponsesRequest"]["properties"]["model"]["enum"] = [api.model_id]
    bound("ResponsesRequest", "max_output_tokens", maximum=limits.max_tokens)
    for field in ("max_tokens", "max_completion_tokens"):
        bound("ChatCompletionRequest", field, maximum=limits.max_tokens)
    bound("MessagesRequest", "max_tokens", maximum=limits.max_tokens)
    schemas["CompletionsRequest"]["properties"]["model"]["enum"] = [api.model_id]
    bound("CompletionsRequest", "max_tokens", maximum=limits.max_tokens)
    bound("CompletionsRequest", "n", maximum=limits.max_n)
    for branch in schemas["CompletionsRequest"]["properties"]["prompt"]["anyOf"]:
        if branch.get("type") == "array":  # token ids: within the vocabulary, at most a prompt's worth
            branch["items"]["maximum"] = len(api.chat.tokenizer) - 1
            branch["maxItems"] = limits.max_prompt_tokens
    bound("ChatCompletionRequest", "n", maximum=limits.max_n)
    bound("ActRequest", "max_tokens", maximum=limits.max_tokens)
    low, high = limits.episodes.reward_range
    for field in ("reward", "rewards"):
        bound("EpisodeReward", field, minimum=low, maximum=high)


def declare_auth(schema: dict, api: PolicyAPI) -> None:
    """Declare the bearer key on every route that needs it, when this server has one (every route that can
    answer 401). The schema itself, ``/docs`` and ``/healthz`` answer without it."""
    if api.limits.api_key is None:
        return
    schema["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    for operations in schema["paths"].values():
        for operation in operations.values():
            if "401" in operation["responses"]:
                operation["security"] = [{"bearer": []}]


def declare_episode_links(paths: dict) -> None:
    """Links from an opened episode to its chat calls, its description and its reward: the token and id the
    201 answers are what those take. Generated clients, and Schemathesis's stateful phase, follow them."""
    token = "$response.body#/token"
    episode = {"path.episode_id": "$response.body#/id", f"header.{EPISODE_HEADER}": token}
    paths["/v1/episodes"]["post"]["responses"]["201"]["links"] = {
        "chat": {
            "operationRef": "#/paths/~1v1~1chat~1completions/post",
            "requestBody": {"user": f"episode:{{{token}}}"},
        },
        "describe": {"operationRef": "#/paths/~1v1~1episodes~1{episode_id}/get", "parameters": episode},
        "reward": {"operationRef": "#/paths/~1v1~1episodes~1{episode_id}~1reward/post", "parameters": episode},
    }


def errors(*statuses: int, anthropic: bool = False) -> dict[int | str, dict]:
    """The OpenAPI ``responses`` of a route's error statuses (see ``serve.errors``), in Anthropic's shape when
    ``anthropic``."""
    model = AnthropicError if anthropic else ErrorResponse
    return {status: {"model": model, "description": ERROR_STATUSES[status]} for status in statuses}


def streamed(model: type[BaseModel], description: str) -> dict:
    """The OpenAPI 200 response of a route that answers ``model`` as JSON, or with ``stream: true`` server-sent
    events (OpenAPI before 3.2 describes an event stream by its events: each has a ``data`` string, the JSON of
    a chunk, an error object or ``[DONE]``, and maybe an ``event`` name)."""
    return {
        "description": description,
        "content": {
            "application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}},
            "text/event-stream": {
                "schema": {
                    "type": "object",
                    "required": ["data"],
                    "properties": {"data": {"type": "string"}, "event": {"type": "string"}},
                }
            },
        },
    }


def json_body(model: type[BaseModel]) -> dict:
    """``openapi_extra`` declaring a route's JSON body (the routes read it themselves, to bound its size)."""
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
        }
    }


# Models the routes declare by hand (bodies they read themselves, the completion beside its event stream):
# their schemas join the app's OpenAPI components.
DECLARED_BY_HAND: tuple[type[BaseModel], ...] = (
    ChatCompletionRequest,
    ResponsesRequest,
    MessagesRequest,
    CompletionsRequest,
    ActRequest,
    ChatCompletion,
    ResponseOut,
    MessageOut,
    TextCompletion,
    EpisodeOpenRequest,
    EpisodeReward,
)


class ReplicaHeader:
    """ASGI middleware: every HTTP response says which replica answered (``X-Replica``), so a client can see that
    an episode's calls stay on one (``serve.episode_affinity``). It only adds a header to the response's start:
    streamed bodies pass through untouched."""

    def __init__(self, app: ASGIApp, replica: str) -> None:
        self.app, self.header = app, (b"x-replica", replica.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def tagged(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), self.header]}
            await send(message)

        await self.app(scope, receive, tagged)


def build_api(api: PolicyAPI) -> FastAPI:
    """The FastAPI app of one ingress replica; every route except /healthz needs the API key when one is set."""
    app = FastAPI(title="agentgym-rl policy", version="1")
    install_error_handlers(app)
    if api.replica is not None:
        app.add_middleware(ReplicaHeader, replica=api.replica)
    authorised = [Depends(api.check_key)]
    # Every route can also answer 500 (anything unexpected), and every route but /healthz 401.
    keyed = (401, 500)

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            _, defs = models_json_schema(
                [(model, "validation") for model in DECLARED_BY_HAND], ref_template="#/components/schemas/{model}"
            )
            schema.setdefault("components", {}).setdefault("schemas", {}).update(defs["$defs"])
            declare_limits(schema["components"]["schemas"], api)
            declare_auth(schema, api)
            declare_episode_links(schema["paths"])
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi

    @app.get("/healthz", responses=errors(500, 503))
    async def healthz() -> Health:
        await api.require_model()
        info = await api.policy.policy()
        return Health(weights_version=info["weights_version"])

    @app.get("/v1/models", dependencies=authorised, responses=errors(*keyed))
    async def models() -> ModelList:
        return ModelList(data=[ModelCard(id=api.model_id, created=api.created)])

    @app.get("/v1/policy", dependencies=authorised, responses=errors(*keyed, 503))
    async def policy() -> PolicyInfo:
        await api.require_model()
        info = await api.policy.policy()
        replicas = {replica: ReplicaCache.of(counters) for replica, counters in info["replicas"].items()}
        return PolicyInfo(
            model=api.model_id, **{**info, "stats": {**info["stats"], **api.counters}, "replicas": replicas}
        )

    @app.post(
        "/v1/chat/completions",
        dependencies=authorised,
        response_model=None,
        openapi_extra=json_body(ChatCompletionRequest),
        responses={
            200: streamed(
                ChatCompletion, "The completion; with `stream: true` server-sent events of chunks, then `[DONE]`."
            ),
            **errors(*keyed, 400, 403, 404, 409, 413, 429, 503),
        },
    )
    async def chat_completions(request: Request) -> ChatCompletion | StreamingResponse:
        body = await api.read_body(request, ChatCompletionRequest)
        token = token_of(request.headers.get(EPISODE_HEADER), body.user)
        if token is not None:
            await api.require_model()
            return await api.complete_in_episode(token, body)
        use = api.tool_use(body)
        completion = api.completion_request(body, use)
        await api.require_model()
        if body.stream:
            weights_version, stream = await api.open_stream(completion)
            return api.event_stream(body, completion, weights_version, stream, use=use)
        return await api.complete(body, completion, use)

    responses_api = ResponsesAPI(api)

    @app.post(
        "/v1/responses",
        dependencies=authorised,
        response_model=None,
        openapi_extra=json_body(ResponsesRequest),
        responses={
            200: streamed(
                ResponseOut,
                "The response (OpenAI's Responses API); with `stream: true` its server-sent events: "
                "`response.created`, output items and their deltas, `response.completed` (or `response.incomplete`).",
            ),
            **errors(*keyed, 400, 403, 404, 409, 413, 429, 503),
        },
    )
    async def responses(request: Request) -> ResponseOut | StreamingResponse:
        body = await api.read_body(request, ResponsesRequest)
        return await responses_api.respond(request, body)

    messages_api = MessagesAPI(api)

    @app.post(
        "/v1/messages",
        dependencies=authorised,
        response_model=None,
        openapi_extra=json_body(MessagesRequest),
        responses={
            200: streamed(
                MessageOut,
                "The message (Anthropic's Messages API); with `stream: true` Anthropic's server-sent "
                "events: `message_start`, content blocks, `message_delta`, `message_stop`.",
            ),
            **errors(*keyed, 400, 403, 404, 409, 413, 429, 503, anthropic=True),
        },
    )
    async def messages(request: Request) -> MessageOut | StreamingResponse:
        body = await api.read_body(request, MessagesRequest)
        return await messages_api.respond(request, body)

    completions_api = CompletionsAPI(api)

    @app.post(
        "/v1/completions",
        dependencies=authorised,
        response_model=None,
        openapi_extra=json_body(CompletionsRequest),
        responses={
            200: streamed(
                TextCompletion,
                "The completion (OpenAI's legacy completions); with `stream: true` server-sent events "
                "of chunks, then `[DONE]`.",
            ),
            **errors(*keyed, 400, 404, 413, 429, 503),
        },
    )
    async def completions(request: Request) -> TextCompletion | StreamingResponse:
        body = await api.read_body(request, CompletionsRequest)
        return await completions_api.respond(body)

    @app.post(
        "/v1/act",
        dependencies=authorised,
        openapi_extra=json_body(ActRequest),
        responses=errors(*keyed, 400, 404, 413, 429, 503),
    )
    async def act(request: Request) -> ActResponse:
        body = await api.read_body(request, ActRequest)
        env = await api.env(body.env)
        messages = [
            {"role": "system", "content": env.instruction},
            *(m.model_dump(exclude={"name"}) for m in body.history),
            {"role": "user", "content": body.observation},
        ]
        params = sampling_params(
            temperature=body.temperature, top_p=None, max_new_tokens=api.token_cap(body.max_tokens, "max_tokens")
        )
        completion = CompletionRequest(prompt_ids=api.prompt(messages), params=params, seed=body.seed)
        await api.require_model()
        result = await api.policy.generate(completion)
        choice = result.choices[0]
        text = api.chat.decode_reply(choice.token_ids)
        parsed = env.parse_action(text)
        invalid = isinstance(parsed, InvalidAction)
        return ActResponse(
            action=None if invalid else parsed,
            invalid_reason=parsed.reason if invalid else None,
            completion=text,
            finish_reason=choice.finish_reason,
            weights_version=result.weights_version,
        )

    @app.post(
        "/v1/episodes",
        dependencies=authorised,
        status_code=201,
        openapi_extra=json_body(EpisodeOpenRequest),
        responses=errors(*keyed, 400, 413, 429),
    )
    async def open_episode(request: Request) -> EpisodeOpened:
        body = await api.read_body(request, EpisodeOpenRequest)
        opened = await api.book.open.remote(body.env, body.task_id, body.group, client_of(request))
        return EpisodeOpened(**answered(opened))

    @app.get("/v1/episodes/{episode_id}", dependencies=authorised, responses=errors(*keyed, 400, 403, 404))
    async def episode(episode_id: str, token: EpisodeToken) -> EpisodeInfo:
        return EpisodeInfo(**answered(await api.book.describe.remote(episode_token(episode_id, token))))

    @app.post(
        "/v1/episodes/{episode_id}/reward",
        dependencies=authorised,
        openapi_extra=json_body(EpisodeReward),
        responses=errors(*keyed, 400, 403, 404, 409, 413),
    )
    async def reward(episode_id: str, token: EpisodeToken, request: Request) -> EpisodeInfo:
        body = await api.read_body(request, EpisodeReward)
        closed = await api.book.close.remote(episode_token(episode_id, token), body.reward, body.rewards)
        return EpisodeInfo(**answered(closed))

    return app

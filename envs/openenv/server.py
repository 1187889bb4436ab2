"""Every registered env served over OpenEnv (``agentgym-rl env-server ENV --protocol openenv``).

The server is the ``openenv`` package's own (``openenv.core.env_server.create_fastapi_app``, which builds its
``HTTPEnvServer``), around :class:`TextEnvironment`: an OpenEnv ``Environment`` that hosts one of this project's
:class:`~agentgym_rl.envs.base.TextEnv`. openenv provides every route: ``POST /reset``, ``POST /step``,
``GET /state``, ``GET /metadata``, ``GET /schema``, ``GET /health``, the WebSocket session at ``/ws``, the task API
(``GET /{env}/splits``, ``POST /{env}/tasks``, ``/{env}/num_tasks``, ``/{env}/task``, ``/{env}/task_range``) and
``/mcp``; this module adds only the bearer-token check and the mapping of its errors to statuses.

Models, per env (``GET /schema`` serves their JSON Schemas):

- action: ``{"text": "<action>"}``, the action as the env's text (a bare action gains ``Action:`` where only that
  parses, as AgentGym's clients send it); where the env describes its actions as functions, either that or
  ``{"tool_call": {"name": ..., "arguments": {...}}}``, turned into the env's action by ``TextEnv.action_of_call``
  (a call that fits no function is answered as an observation saying why, reward 0, as the env answers text it
  cannot parse).
- observation: ``text`` and ``task_id``, with OpenEnv's ``reward`` and ``done`` on every step (``reward`` None on
  reset) and ``metadata``: the entries of the env's info that are JSON.
- state: OpenEnv's ``episode_id`` and ``step_count``, with ``task_id`` and ``done``.

Reset arguments (the reset message's data on ``/ws``, the body of ``POST /reset``): ``task_id`` (the env's own id,
as ``agentgym-rl envs ENV --tasks SPLIT`` lists them); or ``index`` into ``split`` (default ``train``), as
OpenEnv's task API numbers the tasks of a split; or ``seed``, which picks task ``seed % N`` of ``split`` (default
``train``); with none of them, a task of ``split`` at random. ``episode_id`` names the episode (below).

Episodes. A WebSocket session (``/ws``, what openenv's ``EnvClient`` speaks) is an env instance of its own: two
sessions never share state. openenv's HTTP routes build a fresh ``Environment`` for every request, so over HTTP an
episode carries on only when its reset names it: ``POST /reset {"task_id": 3, "episode_id": "mine"}``, then
``POST /step {"action": {...}, "episode_id": "mine"}``. A named episode lives on the server until it ends, is
reset again under its name, or is closed to make room when ``max_envs`` named episodes are live (the least
recently used first). A reset that names no episode only shows the first observation over HTTP.

Errors are FastAPI's ``{"detail": message}`` with a 4xx status, never 200 and never 500 for bad input: 401 a wrong
or missing bearer token, 404 an unknown task id, split or named episode, 409 a step with no episode or after the
episode ended, 413 an action too long, 422 a body of the wrong shape (openenv's own check of the action, or an
unknown reset or step field). Over ``/ws`` the same messages come back as openenv's error frames. An env that
raises unexpectedly is a 500.
"""

from __future__ import annotations

import functools
import hmac
import json
import random
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version
from typing import Any, TypeVar

import pydantic
import structlog
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError
from typing_extensions import override

from agentgym_rl.envs.base import EnvError, InvalidAction, TextEnv, reply_of_action
from agentgym_rl.envs.registry import make
from agentgym_rl.envs.tools import ToolCall

try:
    from openenv.core.env_server import Action, Environment, Observation, State, create_fastapi_app
    from openenv.core.env_server.types import EnvironmentMetadata
except ImportError as exc:  # the optional extra
    raise EnvError(
        f"serving over OpenEnv needs the openenv package ({exc}); install it with pip install -e '.[openenv]'"
    ) from exc

log = structlog.get_logger()
T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

SPLITS = ("train", "test")
# Paths that answer without the token, as on the AgentGym server: the schema and its pages hold no data, and
# clients and fuzzers read the schema first.
OPEN_PATHS = frozenset({"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})
GONE_KEPT = 4096  # named episodes remembered after they end or are closed, for the error a later step gets


class RequestError(EnvError):
    """A request the server refuses, with the HTTP status it answers (the WebSocket session sends the message)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# ------------------------------------------------------------------------------------------------------ models


class ToolCallBody(BaseModel):
    """One call of one of the env's functions."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="The function called (the action's `oneOf` in `/schema` lists them).")
    arguments: dict[str, Any] = Field(default_factory=dict, description="The call's arguments, a JSON object.")


class TextAction(Action):
    """An action as the env's text."""

    text: str = Field(description="The action: the env's action text, or a reply that holds one (`Action: ...`).")

    @field_validator("text")
    @classmethod
    def _utf8(cls, text: str) -> str:
        return utf8(text)


class TextOrToolAction(Action):
    """An action as the env's text or as a call of one of its functions: exactly one of the two."""

    text: str | None = Field(None, description="The action as the env's text (give this or `tool_call`).")
    tool_call: ToolCallBody | None = Field(None, description="The action as a function call (or `text`).")

    @field_validator("text")
    @classmethod
    def _utf8(cls, text: str | None) -> str | None:
        return None if text is None else utf8(text)

    @model_validator(mode="after")
    def _one_of_two(self) -> TextOrToolAction:
        if (self.text is None) == (self.tool_call is None):
            # A PydanticCustomError carries no exception in its context, so the 422 it becomes stays JSON.
            raise PydanticCustomError("one_action", "give exactly one of `text` and `tool_call`")
        return self


class TextObservation(Observation):
    """What the agent sees: the env's observation text; reward, done and the env's info (`metadata`) beside it."""

    text: str = Field(description="Observation text (after reset: the task and the first view).")
    task_id: int | None = Field(None, description="The env's id of the episode's task.")


class TextEnvState(State):
    """The episode a session (or a named HTTP episode) is playing."""

    task_id: int | None = Field(None, description="The env's id of the episode's task; None before the first reset.")
    done: bool = Field(False, description="Whether the episode has ended.")


class ResetArgs(BaseModel):
    """What a reset may name (the reset message's data, or the body of `POST /reset`)."""

    model_config = ConfigDict(extra="forbid")

    task_id: int | None = Field(None, strict=True, description="The env's task id (`agentgym-rl envs ENV --tasks`).")
    split: str | None = Field(None, description="The split `index` and `seed` pick from (default `train`).")
    index: int | None = Field(None, strict=True, ge=0, description="Position of the task in `split`.")
    seed: int | None = Field(None, strict=True, ge=0, description="Picks task `seed % N` of `split`.")
    episode_id: str | None = Field(
        None, min_length=1, max_length=255, description="Names the episode so HTTP steps can continue it."
    )

    @model_validator(mode="after")
    def _one_way(self) -> ResetArgs:
        if self.task_id is not None and (self.split, self.index, self.seed) != (None, None, None):
            raise PydanticCustomError("one_task", "give `task_id`, or `split` with `index` or `seed`, not both")
        if self.index is not None and self.seed is not None:
            raise PydanticCustomError("one_task", "give `index` or `seed`, not both")
        return self


def action_model(env_name: str, env: TextEnv) -> type[Action]:
    """The action model of ``env``: text alone, or text or a tool call where the env has functions; its JSON Schema
    requires exactly one of the two and lists each function with the schema of its arguments."""
    title = _title(env_name)
    functions = env.functions()
    if not functions:
        return _subclass(f"{title}Action", TextAction, f"An action of {env_name}, as text.")
    calls = [
        {"properties": {"name": {"const": f.name, "description": f.description}, "arguments": f.parameters}}
        for f in functions
    ]
    call_model = _subclass(
        f"{title}ToolCall",
        ToolCallBody,
        f"A call of one of {env_name}'s functions.",
        json_schema_extra={"oneOf": calls},
    )
    return _subclass(
        f"{title}Action",
        TextOrToolAction,
        f"An action of {env_name}, as text or as a call of one of its functions.",
        json_schema_extra={"oneOf": [{"required": ["text"]}, {"required": ["tool_call"]}]},
        tool_call=(call_model | None, Field(None, description="The action as a function call (or `text`).")),
    )


def observation_model(env_name: str) -> type[TextObservation]:
    """The observation model of env ``env_name`` (:class:`TextObservation`, named after the env in `/schema`)."""
    return _subclass(f"{_title(env_name)}Observation", TextObservation, f"An observation of {env_name}.")


def _subclass(name: str, base: type[M], doc: str, json_schema_extra: dict | None = None, **fields: Any) -> type[M]:
    """A subclass of ``base`` named ``name`` (its name in the JSON Schemas), with ``fields`` added or replaced."""
    namespace: dict[str, Any] = {"__doc__": doc, "__module__": __name__, "__annotations__": {}}
    if json_schema_extra is not None:
        namespace["model_config"] = ConfigDict(json_schema_extra=json_schema_extra)
    for field, (annotation, default) in fields.items():
        namespace["__annotations__"][field] = annotation
        namespace[field] = default
    return type(name, (base,), namespace)


def _title(env_name: str) -> str:
    return "".join(part.capitalize() for part in env_name.replace("_", "-").split("-"))


def utf8(text: str) -> str:
    """``text`` with lone surrogates (JSON may carry ``"\\udcff"``; UTF-8 cannot) as U+FFFD, so envs and the
    response encoder can take it."""
    return text.encode("utf-8", "replace").decode("utf-8")


def json_info(info: dict[str, Any]) -> dict[str, Any]:
    """The entries of an env's ``info`` that are JSON as UTF-8 (NaN, infinities and lone surrogates are not)."""
    kept = {}
    for key, value in info.items():
        try:
            json.dumps(value, allow_nan=False, ensure_ascii=False).encode("utf-8")
        except (TypeError, ValueError):  # UnicodeEncodeError is a ValueError
            continue
        kept[str(key)] = value
    return kept


# ---------------------------------------------------------------------------------------------------- episodes


class Episode:
    """One env instance and its current episode. Every call to the env runs on the episode's own thread, one at a
    time: envs bound to the thread that made them (the web env's browser) work, and a step never overlaps a reset."""

    def __init__(self, make_env: Callable[[], TextEnv], name: str | None = None) -> None:
        self.name = name
        self._make_env = make_env
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="openenv-episode")
        self.env: TextEnv | None = None
        self.task_id: int | None = None
        self.steps = 0
        self.done = False
        self.closed = False

    def call(self, fn: Callable[[], T]) -> T:
        """``fn()`` on the episode's thread, after any call in flight."""
        return self._thread.submit(fn).result()

    def reset(self, task_id: int) -> Any:
        """The env's first observation of task ``task_id``. Raises RequestError: 404 for a task the env refuses."""

        def run() -> Any:
            self._check_open()
            if self.env is None:
                self.env = self._make_env()
            try:
                observation = self.env.reset(task_id)
            except EnvError as exc:
                raise RequestError(404, f"cannot reset to task {task_id}: {exc}") from exc
            self.task_id, self.steps, self.done = task_id, 0, False
            return observation

        return self.call(run)

    def step(self, action: str | ToolCall) -> tuple[str, float, bool, dict[str, Any]]:
        """(observation, reward, done, info) of one step. Raises RequestError: 409 before a reset or after the end,
        404 once closed."""

        def run() -> tuple[str, float, bool, dict[str, Any]]:
            if self.done:  # (a named episode is closed once it ends)
                raise RequestError(409, f"the episode{self._named()} is over: reset to start another")
            self._check_open()
            if self.env is None or self.task_id is None:
                raise RequestError(409, "no episode yet: reset first")
            text = action if isinstance(action, str) else self.env.action_of_call(action)
            if isinstance(text, InvalidAction):  # answered as the env answers text it cannot parse
                return utf8(text.reason), 0.0, False, {"action_valid": False}
            result = self.env.step(reply_of_action(self.env, text))
            self.steps += 1
            self.done = result.done
            return result.observation, result.reward, result.done, result.info

        return self.call(run)

    def close(self) -> None:
        """Close the env (after any call in flight) and the episode's thread; later calls get 404."""
        if self.closed:
            return

        def run() -> None:
            self.closed = True
            if self.env is not None:
                self.env.close()

        try:
            self.call(run)
        finally:
            self._thread.shutdown(wait=False)

    def _check_open(self) -> None:
        if self.closed:
            raise RequestError(
                404, f"the episode{self._named()} was closed (reset again under another name, or too many were live)"
            )

    def _named(self) -> str:
        return f" {self.name!r}" if self.name else ""


class NamedEpisodes:
    """The episodes resets named (``episode_id``), at most ``limit`` live: a new one beyond closes the least
    recently used. An episode that ends is closed and forgotten (its name kept for the error a later step gets)."""

    def __init__(self, make_env: Callable[[], TextEnv], limit: int) -> None:
        self._make_env = make_env
        self.limit = limit
        self._live: OrderedDict[str, Episode] = OrderedDict()  # least recently used first
        self._gone: OrderedDict[str, tuple[int, str]] = OrderedDict()  # name -> the status and why, for a step
        self._lock = threading.Lock()

    def for_reset(self, name: str) -> Episode:
        """The episode named ``name``, made when it is not live (closing the least recently used at the limit)."""
        evicted = None
        with self._lock:
            episode = self._live.get(name)
            if episode is None or episode.closed:
                if len(self._live) >= self.limit:
                    _, evicted = self._live.popitem(last=False)
                    why = f"closed to make room: {self.limit} named episodes were live (--max-envs)"
                    self._forget(evicted.name, 404, why)
                episode = self._live[name] = Episode(self._make_env, name)
                self._gone.pop(name, None)
            self._live.move_to_end(name)
        if evicted is not None:
            log.info("openenv episode closed to make room", episode=evicted.name, limit=self.limit)
            evicted.close()
        return episode

    def for_step(self, name: str) -> Episode:
        """The live episode named ``name``. Raises RequestError: 409 for one that ended, 404 for any other."""
        with self._lock:
            episode = self._live.get(name)
            if episode is not None:
                self._live.move_to_end(name)
                return episode
            gone = self._gone.get(name)
        if gone is not None:
            status, why = gone
            raise RequestError(status, f"episode {name!r} is over ({why}): POST /reset to start another")
        raise RequestError(404, f"no live episode {name!r}: POST /reset with that episode_id starts one")

    def ended(self, episode: Episode) -> None:
        """Forget ``episode`` (it ended) and close its env."""
        with self._lock:
            if self._live.get(episode.name) is episode:
                del self._live[episode.name]
                self._forget(episode.name, 409, "it ended")
        episode.close()

    def close_all(self) -> None:
        with self._lock:
            episodes = list(self._live.values())
            self._live.clear()
        for episode in episodes:
            episode.close()

    def _forget(self, name: str | None, status: int, why: str) -> None:
        # Called holding the lock.
        if name is None:
            return
        self._gone[name] = (status, why)
        while len(self._gone) > GONE_KEPT:
            self._gone.popitem(last=False)


# ----------------------------------------------------------------------------------------------------- the env


class Tasks:
    """The env's splits and task ids, read once from one instance (the task API asks a fresh ``Environment``
    every time)."""

    def __init__(self, env: TextEnv) -> None:
        self._env = env
        self._lock = threading.Lock()  # the instance answers one caller at a time
        self._ids: dict[str, list[int]] = {}
        for split in SPLITS:
            try:
                self._ids[split] = list(env.tasks(split))
            except EnvError:
                continue

    def splits(self) -> list[str]:
        return list(self._ids)

    def ids(self, split: str) -> list[int]:
        """Task ids of ``split``. Raises RequestError 404 for a split the env does not have."""
        if split not in self._ids:
            raise RequestError(404, f"no split {split!r}; the splits are: {', '.join(self._ids)}")
        return self._ids[split]

    def spec(self, split: str, index: int) -> dict[str, Any]:
        """The task at ``index`` of ``split``, as the task API lists it."""
        task_id = self.ids(split)[index]
        with self._lock:
            category = self._env.task_category(task_id)
        return {"task_id": task_id, "split": split, "index": index, "category": category}

    def choose(self, args: ResetArgs) -> int:
        """The task id a reset names (see the module docstring)."""
        if args.task_id is not None:
            return args.task_id
        split = args.split or "train"
        ids = self.ids(split)
        if not ids:
            raise RequestError(404, f"split {split!r} has no tasks")
        if args.index is not None:
            if args.index >= len(ids):
                raise RequestError(404, f"no task at index {args.index} of split {split!r}, which has {len(ids)}")
            return ids[args.index]
        if args.seed is not None:
            return ids[args.seed % len(ids)]
        return random.choice(ids)


class Served:
    """What every :class:`TextEnvironment` of one server shares: the env to make, its tasks, the named episodes."""

    def __init__(self, env_name: str, options: dict[str, Any], probe: TextEnv, max_envs: int, max_chars: int) -> None:
        self.env_name = env_name
        self.options = options
        self.instruction = probe.instruction
        self.tasks = Tasks(probe)
        self.named = NamedEpisodes(self.make_env, max_envs)
        self.max_action_chars = max_chars
        self.observation_cls = observation_model(env_name)

    def make_env(self) -> TextEnv:
        return make(self.env_name, self.options)


class TextEnvironment(Environment):
    """One of this project's envs as an OpenEnv ``Environment``: openenv's server makes one per WebSocket session
    (and a short-lived one per HTTP request), each with an env instance of its own once it resets."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, served: Served) -> None:
        super().__init__()
        self._served = served
        self._own: Episode | None = None  # this session's env, made at its first unnamed reset
        self._current: Episode | None = None  # the episode steps without an episode_id go to

    @override
    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> TextObservation:
        """Start an episode (the task as the module docstring says). Raises RequestError: 422 for arguments of the
        wrong shape, 404 for a task, split or index the env does not have."""
        given = {"seed": seed, "episode_id": episode_id, **kwargs}
        try:
            args = ResetArgs.model_validate({key: value for key, value in given.items() if value is not None})
        except pydantic.ValidationError as exc:
            raise RequestError(422, f"reset: {_problems(exc)}") from None
        task_id = self._served.tasks.choose(args)
        if args.episode_id is not None:
            episode = self._served.named.for_reset(args.episode_id)
        else:
            if self._own is None:
                self._own = Episode(self._served.make_env)
            episode = self._own
        observation = episode.reset(task_id)
        self._current = episode
        return self._served.observation_cls(
            text=observation.text, task_id=task_id, reward=None, done=False, metadata=json_info(observation.info)
        )

    @override
    def step(
        self,
        action: Action,
        timeout_s: float | None = None,
        episode_id: str | None = None,
        request_id: str | None = None,
        **unknown: Any,
    ) -> TextObservation:
        """One step of the session's episode, or of the named one (``episode_id``, how HTTP steps continue an
        episode). ``timeout_s`` and ``request_id``, fields of openenv's step body, are accepted and not used.

        Raises:
            RequestError: 422 an unknown field, 413 an action too long, 409 no episode or one that ended, 404 an
                unknown name.
        """
        if unknown:
            raise RequestError(
                422, f"step: unknown field(s) {', '.join(sorted(unknown))}; a step takes action and episode_id"
            )
        if episode_id is not None:
            episode = self._served.named.for_step(episode_id)
        elif self._current is not None:
            episode = self._current
        else:
            raise RequestError(
                409,
                'no episode to step: reset first (over HTTP, name the episode: POST /reset {..., "episode_id": NAME}, '
                "then send that episode_id with every POST /step; a WebSocket session keeps its episode)",
            )
        move = self._move(action)
        text, reward, done, info = episode.step(move)
        if done and episode.name is not None:
            self._served.named.ended(episode)
        return self._served.observation_cls(
            text=text, task_id=episode.task_id, reward=reward, done=done, metadata=json_info(info)
        )

    @property
    @override
    def state(self) -> TextEnvState:
        episode = self._current
        if episode is None:
            return TextEnvState()
        return TextEnvState(
            episode_id=episode.name, step_count=episode.steps, task_id=episode.task_id, done=episode.done
        )

    @override
    def get_metadata(self) -> EnvironmentMetadata:
        """The env's name; ``readme_content`` is its instruction (the system prompt: task format, action syntax)."""
        return EnvironmentMetadata(
            name=self._served.env_name,
            description=f"agentgym-rl env {self._served.env_name!r} served over OpenEnv",
            readme_content=self._served.instruction,
            version=version("agentgym-rl"),
        )

    @override
    def close(self) -> None:
        """Close the session's own env; named episodes live on (they end, are reset or make room)."""
        if self._own is not None:
            self._own.close()
            self._own = None

    # The task API (openenv's TaskProvider protocol: it calls these on a fresh instance).

    def list_splits(self) -> list[str]:
        return self._served.tasks.splits()

    def list_tasks(self, split: str) -> list[dict[str, Any]]:
        return [self._served.tasks.spec(split, index) for index in range(len(self._served.tasks.ids(split)))]

    def num_tasks(self, split: str) -> int:
        return len(self._served.tasks.ids(split))

    def get_task(self, split: str, index: int) -> dict[str, Any]:
        if index < 0:
            raise IndexError(index)  # openenv answers 400 "Invalid task index"
        return self._served.tasks.spec(split, index)

    def get_task_range(self, split: str, start: int | None = None, stop: int | None = None) -> list[dict[str, Any]]:
        indices = range(len(self._served.tasks.ids(split)))[start:stop]
        return [self._served.tasks.spec(split, index) for index in indices]

    def _move(self, action: Action) -> str | ToolCall:
        text = getattr(action, "text", None)
        call = getattr(action, "tool_call", None)
        if call is not None:
            size = len(json.dumps(call.arguments))
            if size > self._served.max_action_chars:
                raise RequestError(
                    413, f"tool call arguments have {size} characters; at most {self._served.max_action_chars}"
                )
            return ToolCall(id=f"call_{self._served.env_name}", name=call.name, arguments=call.arguments)
        if len(text) > self._served.max_action_chars:
            raise RequestError(
                413, f"action has {len(text)} characters; this server accepts at most {self._served.max_action_chars}"
            )
        return text


def _problems(exc: pydantic.ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or 'body'}: "
        + ("unknown field" if err["type"] == "extra_forbidden" else err["msg"])
        for err in exc.errors()
    )


# ---------------------------------------------------------------------------------------------------- the app


class BearerToken:
    """ASGI middleware: every HTTP request and WebSocket handshake must carry ``Authorization: Bearer <token>``
    (compared in constant time); the schema and its pages answer without it."""

    def __init__(self, app: Any, token: str) -> None:
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket") or scope["path"] in OPEN_PATHS:
            return await self.app(scope, receive, send)
        given = dict(scope.get("headers", ())).get(b"authorization", b"")
        if hmac.compare_digest(given, self.expected):
            return await self.app(scope, receive, send)
        from starlette.responses import JSONResponse
        from starlette.websockets import WebSocket

        refusal = JSONResponse(
            {"detail": "missing or wrong bearer token (header 'Authorization: Bearer <token>')"}, status_code=401
        )
        if scope["type"] == "http":
            return await refusal(scope, receive, send)
        websocket = WebSocket(scope, receive, send)
        if "websocket.http.response" in scope.get("extensions", {}):
            return await websocket.send_denial_response(refusal)
        return await websocket.close(code=1008, reason="missing or wrong bearer token")


def build_openenv_app(
    env_name: str,
    options: dict[str, Any] | None = None,
    *,
    max_envs: int = 64,
    token: str | None = None,
    max_action_chars: int = 100_000,
) -> Any:
    """The FastAPI app (openenv's own) serving env ``env_name`` over OpenEnv.

    Args:
        env_name: a registered env name.
        options: options for every env instance, validated here (a bad option fails now, not per request).
        max_envs: WebSocket sessions allowed at once, and named HTTP episodes live at once.
        token: when set, every request (and WebSocket handshake) needs ``Authorization: Bearer <token>``.
        max_action_chars: the longest action text (or tool call arguments as JSON) a step accepts.

    Raises:
        EnvError: unknown env name. pydantic.ValidationError: bad options. ValueError: ``max_envs`` below 1.
    """
    from fastapi import Request
    from fastapi.encoders import jsonable_encoder
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

    from agentgym_rl.envs.http.server import AsciiJSONResponse

    if max_envs < 1:
        raise ValueError(f"--max-envs must be at least 1, got {max_envs}")
    options = options or {}
    probe = make(env_name, options)  # a bad name or option fails here, not per request
    served = Served(env_name, options, probe, max_envs, max_action_chars)
    app = create_fastapi_app(
        functools.partial(TextEnvironment, served),
        action_model(env_name, probe),
        served.observation_cls,
        max_concurrent_envs=max_envs,
        env_name=env_name,
        state_cls=TextEnvState,
        mode="simulation",
    )
    app.title = f"agentgym-rl env server over OpenEnv: {env_name}"

    # Every error leaves as {"detail": ...} (FastAPI's shape, which openenv's own errors have) in ASCII JSON: a
    # request's text echoed back (lone surrogates included) stays encodable.

    @app.exception_handler(RequestError)
    async def _refused(request: Request, exc: RequestError) -> JSONResponse:
        return AsciiJSONResponse({"detail": exc.message}, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return AsciiJSONResponse({"detail": jsonable_encoder(exc.errors())}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return AsciiJSONResponse(
            {"detail": jsonable_encoder(exc.detail)}, status_code=exc.status_code, headers=exc.headers
        )

    def _close_named() -> None:
        served.named.close_all()
        probe.close()

    app.router.on_shutdown.append(_close_named)
    if token is not None:
        app.add_middleware(BearerToken, token=token)
    return app


def serve_openenv(
    env_name: str,
    *,
    host: str = "127.0.0.1",
    port: int = 36001,
    max_envs: int = 64,
    options: dict[str, Any] | None = None,
    token: str | None = None,
) -> None:
    """Build the OpenEnv app for ``env_name`` and serve it with uvicorn until interrupted (blocks)."""
    import uvicorn

    app = build_openenv_app(env_name, options, max_envs=max_envs, token=token)
    log.info("env server", env=env_name, url=f"http://{host}:{port}", protocol="openenv", max_envs=max_envs)
    uvicorn.run(app, host=host, port=port, log_level="warning")

"""``OpenEnvClient``: a ``TextEnv`` that plays episodes on any OpenEnv server (env ``openenv``).

An OpenEnv server (PyPI ``openenv``: an ``Environment`` wrapped by ``create_app``) answers ``POST /reset`` and
``POST /step`` with a fresh environment per request (openenv 0.10), so an episode of several steps is played in
its WebSocket session at ``/ws`` instead: one session per env instance, reused across its episodes, with the
messages ``reset`` (the reset arguments), ``step`` (the action JSON) and ``close``, each answered by an
``observation`` (``{observation, reward, done, metadata}``) or an ``error`` message. ``GET /health``,
``GET /schema`` and the task API (``GET /list_environments``, ``GET /{env}/splits``, ``POST /{env}/num_tasks``)
are read over plain HTTP with httpx. The client speaks these documented routes itself rather than through
``openenv.core``'s client, whose import loads the package's web UI (gradio: seconds of CPU in every env actor);
it needs ``websockets``, which the ``openenv`` extra installs.

- Actions: the text after the reply's last ``Action:`` (or the whole reply, ``parse: reply``) goes into the
  action field (``action_field``; by default the one string field of the server's action schema), together
  with the fixed ``action_defaults``. With ``tools``, the server's actions are tool calls, offered as the env's
  functions (``env.action_format: tools``): ``mcp``, an OpenEnv MCP environment's tools (a ``list_tools`` action),
  each call sent as a ``call_tool`` action; ``action-schema``, the functions the action schema lists in its call
  field (``{"name": {"const": ...}, "arguments": {...}}`` variants, as this project's server describes an env's
  functions), each call sent in that field. In text format the reply ends with
  ``Action: {"name": ..., "arguments": {...}}``.
- Observations: the fields named in ``observation_fields`` (by default every field but ``reward``, ``done``
  and ``metadata``) make the text the model reads; the server's ``metadata`` becomes the step's info.
- Tasks: ``tasks(split)`` numbers the tasks of every split in one sequence, split after split (so a task id
  names its split): from ``splits`` when given (ids, or a count per split), else from the server's task API.
  ``reset(task_id)`` sends ``reset_args`` with the task's id, split and index filled in (by default the task
  API's ``split`` and ``index``, or ``seed`` = the task id when ``splits`` lists the tasks).
- ``command`` starts a server per env instance (on a free port when it holds ``{port}``), waits until its
  ``/health`` answers, and stops it on ``close`` (or, on Linux, when the instance's process dies).

A server that is down, too slow (``timeout``) or answers what OpenEnv's protocol does not raises
``OpenEnvError`` (an ``EnvUnavailable``) naming the URL: the sampler moves the episode to a fresh env actor once,
then records it as failed (never trained on), and the run goes on.

Example (config)::

    env:
      name: openenv
      options: {base_url: "http://127.0.0.1:8000", action_field: message, splits: {train: 64, test: 16}}
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx
import pydantic
from pydantic import BaseModel, ConfigDict, Field, model_validator

from agentgym_rl.envs.base import EnvError, EnvUnavailable, InvalidAction, Observation, StepResult, TextEnv
from agentgym_rl.envs.http.client import GENERIC_INSTRUCTION, generic_parse_action
from agentgym_rl.envs.tools import Function, ToolCall

# Fields every OpenEnv observation carries beside the env's own: they are not text for the model.
_PROTOCOL_FIELDS = ("reward", "done", "metadata")
_LOOPBACK = ("127.0.0.1", "localhost", "::1")
TOOL_FORMAT = 'Action: {"name": "<tool>", "arguments": {...}}'


class OpenEnvError(EnvUnavailable):
    """The OpenEnv server failed: it cannot be reached, answered too late, or its answer is not OpenEnv's protocol."""


class OpenEnvClient(TextEnv):
    """One env instance on an OpenEnv server: one WebSocket session, its episodes one after another."""

    name = "openenv"

    class Options(BaseModel):
        """Options of the OpenEnv client."""

        model_config = ConfigDict(extra="forbid")

        base_url: str = Field(
            description="Server address, e.g. http://127.0.0.1:8000. With `command` it may hold `{port}`, which "
            "becomes the free port the command's server is started on."
        )
        command: str | None = Field(
            default=None,
            description="Command line that starts the server (it may hold `{port}`), split as a shell would but run "
            "without one (a script for pipes or `&&`); each env instance starts its own on first use, waits until "
            "GET /health answers, and stops it on close or when the instance's process dies. None: the server at "
            "`base_url` is already running.",
        )
        startup_timeout: float = Field(
            default=60.0, gt=0, description="Seconds `command`'s server may take until its /health answers."
        )
        action_field: str | None = Field(
            default=None,
            description="Field of the server's action JSON that receives the model's action text. None: the one "
            "string (or optional string) field of the action schema (GET /schema).",
        )
        action_defaults: dict[str, Any] = Field(
            default_factory=dict, description="Fixed fields sent with every action, beside `action_field`."
        )
        parse: Literal["action-line", "reply"] = Field(
            default="action-line",
            description="What becomes the action text: 'action-line' the first line after the reply's last "
            "'Action:' (a reply without one is answered with how to write it, the server is not asked), 'reply' "
            "the whole reply. With `tools`, a call is always an 'Action:' line.",
        )
        observation_fields: list[str] | None = Field(
            default=None,
            description="Observation fields shown to the model, in order: null ones left out, the value alone when "
            "one is left, else 'field: value' lines. None: every field but reward, done and metadata.",
        )
        instruction: str | None = Field(
            default=None,
            description="System prompt. None: a generic one asking for an 'Action:' line (with `tools`, also the "
            "JSON call format and the server's tools).",
        )
        splits: dict[str, list[int] | int] = Field(
            default_factory=dict,
            description="Tasks per split: a list of task ids, or a count (ids numbered on from the previous "
            "split's, in the order given). Empty: the server's task API (its splits and their task counts).",
        )
        env_name: str | None = Field(
            default=None,
            description="The env's name in the server's task API routes (/{env_name}/splits). None: the first "
            "name GET /list_environments answers.",
        )
        reset_args: dict[str, Any] | None = Field(
            default=None,
            description="Arguments of each reset; the strings '{task_id}', '{split}' and '{index}' (the task's "
            "position in its split) are filled in. None: {split, index}, OpenEnv's task API convention, when the "
            "tasks come from the server's task API; {seed: task_id} when they come from `splits`.",
        )
        tools: Literal["mcp", "action-schema"] | None = Field(
            default=None,
            description="The server's actions are tool calls, offered as functions (env.action_format: tools): "
            "'mcp' an OpenEnv MCP environment's tools, each call sent as a call_tool action; 'action-schema' the "
            "functions listed by the action schema's call field (a `oneOf` of {name: {const}, arguments}), each "
            "call sent in that field. None: the action is text.",
        )
        timeout: float = Field(default=60.0, gt=0, description="Seconds to wait for one request or step answer.")
        token: str | None = Field(default=None, description="Bearer token, when the server requires one.")

        @model_validator(mode="after")
        def _consistent(self) -> OpenEnvClient.Options:
            if "{port}" in self.base_url and self.command is None:
                raise ValueError(
                    "base_url holds {port}, which only a `command` fills: set `command` to the shell command that "
                    "starts the server, or give the running server's address"
                )
            if self.command is not None and "{port}" in self.command and "{port}" not in self.base_url:
                raise ValueError("`command` holds {port} but base_url does not: write base_url as http://HOST:{port}")
            if self.tools and (self.action_field is not None or self.action_defaults):
                raise ValueError("with `tools` the action is a tool call: leave action_field and action_defaults out")
            return self

    def __init__(self, **options: Any) -> None:
        self.options = self.Options(**options)
        self.base_url = self.options.base_url
        self._server: subprocess.Popen | None = None
        self._server_log: Any = None
        self._http: httpx.Client | None = None
        self._session: Any = None  # websockets' ClientConnection, opened on first use
        self._episode = False
        self._refusal = ""  # why the server refused the last step's action (see _exchange)

    # ------------------------------------------------------------------------------------------------ TextEnv

    @property
    def instruction(self) -> str:
        """The ``instruction`` option, else a generic prompt (with ``tools``, the call format and the tools)."""
        if self.options.instruction is not None:
            return self.options.instruction
        if not self.options.tools:
            return GENERIC_INSTRUCTION
        tools = "\n".join(f"- {f.name}: {f.description}" for f in self.functions())
        return (
            "You are an agent acting in an environment through tools. Each turn, think briefly, then end your "
            f"reply with one line calling one tool as JSON:\n{TOOL_FORMAT}\nThe tools:\n{tools}"
        )

    @property
    def tool_instruction(self) -> str:
        """The ``instruction`` option, else a generic prompt asking for one tool call a turn (the tool format then
        lists the functions)."""
        if self.options.instruction is not None:
            return self.options.instruction
        return (
            "You are an agent acting in an environment through its tools. Each turn, think briefly, then call one tool."
        )

    def tasks(self, split: str) -> Sequence[int]:
        """Task ids of ``split``, from the ``splits`` option or the server's task API.

        Raises:
            EnvError: ``split`` is not a split of the env, or the server has no task API and ``splits`` is empty.
            OpenEnvError: the server failed.
        """
        splits = self._splits
        if split not in splits:
            raise EnvError(
                f"unknown split {split!r} of the OpenEnv server at {self.base_url}; its splits: "
                f"{', '.join(splits) or 'none'} (set env.options.splits to name others)"
            )
        # A server whose actions the options cannot fill fails here, before any episode.
        if self.options.tools is None:
            self._action_field  # noqa: B018
        elif self.options.tools == "action-schema":
            self._schema_tools  # noqa: B018
        return list(splits[split])

    def parse_action(self, model_text: str) -> str | InvalidAction:
        """The action text per the ``parse`` option; with ``tools``, a JSON call of one of the functions, checked
        against its arguments' schema."""
        if not self.options.tools:
            return model_text if self.options.parse == "reply" else generic_parse_action(model_text)
        action = generic_parse_action(model_text)  # a call is always an "Action:" line
        if isinstance(action, InvalidAction):
            return action
        try:
            call = json.loads(action)
        except ValueError:
            call = None
        if not (
            isinstance(call, dict) and isinstance(call.get("name"), str) and isinstance(call.get("arguments"), dict)
        ):
            return InvalidAction(reason=f"the action is not a tool call; end your reply with one line {TOOL_FORMAT}")
        # The function and its arguments are checked as a tool-format call is (TextEnv.action_of_call).
        checked = self.action_of_call(ToolCall(id="call_text", name=call["name"], arguments=call["arguments"]))
        if isinstance(checked, InvalidAction):
            return checked
        return json.dumps({"name": call["name"], "arguments": call["arguments"]})

    def reset(self, task_id: int) -> Observation:
        """Start the episode of ``task_id`` in this instance's session (opened on first use).

        Raises:
            EnvError: ``task_id`` is in no split.
            OpenEnvError: the server failed.
        """
        split, index = self._locate(task_id)
        fill = {"{task_id}": task_id, "{split}": split, "{index}": index}
        args = {key: _filled(value, fill) for key, value in self._reset_args.items()}
        self._episode = False
        data = self._exchange("reset", args)
        self._episode = True
        return Observation(text=self._text(data), info=_metadata(data))

    def step(self, action_text: str) -> StepResult:
        """Send the action in ``action_text``; a reply without one is answered here, the server is not asked.

        Raises:
            EnvError: no episode has started.
            OpenEnvError: the server failed.
        """
        if not self._episode:
            raise EnvError("no episode has started on the OpenEnv server; call reset first")
        action = self.parse_action(action_text)
        if isinstance(action, InvalidAction):
            return StepResult(observation=action.reason, reward=0.0, done=False, info={"action_valid": False})
        if self.options.tools == "mcp":
            call = json.loads(action)
            body = {"type": "call_tool", "tool_name": call["name"], "arguments": call["arguments"]}
        elif self.options.tools == "action-schema":
            body = {self._schema_tools[0]: json.loads(action)}
        else:
            body = {**self.options.action_defaults, self._action_field: action}
        data = self._exchange("step", body)
        if data is None:  # the server refused the action's shape: the model reads why
            return StepResult(observation=self._refusal, reward=0.0, done=False, info={"action_valid": False})
        reward = data.get("reward")
        if reward is not None and (isinstance(reward, bool) or not isinstance(reward, int | float)):
            raise OpenEnvError(f"the OpenEnv server at {self.base_url} answered a step with reward {reward!r}")
        return StepResult(
            observation=self._text(data),
            reward=float(reward or 0.0),
            done=bool(data.get("done")),
            info=_metadata(data),
        )

    def functions(self) -> list[Function]:
        """With ``tools``, the server's tools (asked once: a ``list_tools`` action, or the action schema); otherwise
        none.

        Raises:
            OpenEnvError: the server failed, or its tool list is not one.
        """
        if self.options.tools == "mcp":
            return list(self._mcp_tools)
        return list(self._schema_tools[1]) if self.options.tools == "action-schema" else []

    def action_text(self, call: ToolCall) -> str:
        """The call as the text format writes it: ``Action: {"name": ..., "arguments": {...}}``.

        Raises:
            EnvError: ``tools`` is off, so the env has no functions.
        """
        if not self.options.tools:
            raise EnvError("the openenv env offers functions only with env.options.tools (mcp or action-schema)")
        return "Action: " + json.dumps({"name": call.name, "arguments": call.arguments})

    def close(self) -> None:
        """End the session, close the HTTP client and stop ``command``'s server (each best effort)."""
        if self._session is not None:
            with contextlib.suppress(Exception):  # the server may be gone already
                self._session.send(json.dumps({"type": "close"}))
            self._drop_session()
        if self._http is not None:
            self._http.close()
            self._http = None
        if self._server is not None:
            _stop(self._server)
            self._server = None
            self._server_log.close()

    # ---------------------------------------------------------------------------------------------- the server

    def _client(self) -> httpx.Client:
        """The HTTP client of the server (started first when ``command`` is set)."""
        if self._http is None:
            if self.options.command is not None:
                self._start()
            self._http = httpx.Client(base_url=self.base_url, timeout=self.options.timeout, headers=self._headers())
        return self._http

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.options.token}"} if self.options.token else {}

    def _start(self) -> None:
        """Start ``command``'s server and wait until its ``/health`` answers.

        Raises:
            OpenEnvError: the command exited, or its server did not answer within ``startup_timeout``.
        """
        port = str(_free_port())
        self.base_url = self.options.base_url.replace("{port}", port)
        command = self.options.command.replace("{port}", port)
        self._server_log = tempfile.TemporaryFile()  # noqa: SIM115 (open while the server runs; close() closes it)
        try:
            # Its own process group, which close() stops whole. Ray kills an env actor without close(): on Linux
            # the server is also sent SIGTERM when the process that started it dies.
            self._server = subprocess.Popen(
                shlex.split(command),
                stdout=self._server_log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_DIE_WITH_PARENT,  # noqa: PLW1509 (one libc call, no Python lock taken)
            )
        except OSError as exc:
            raise OpenEnvError(f"the OpenEnv server command {command!r} cannot start: {exc}") from exc
        deadline = time.monotonic() + self.options.startup_timeout
        while time.monotonic() < deadline:
            if self._server.poll() is not None:
                raise OpenEnvError(
                    f"the OpenEnv server command {command!r} exited with code {self._server.returncode} before "
                    f"{self.base_url}/health answered; its output ends: {self._server_output()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base_url}/health", timeout=1.0, headers=self._headers()).is_success:
                    return
            time.sleep(0.1)
        raise OpenEnvError(
            f"the OpenEnv server command {command!r} did not answer at {self.base_url}/health within "
            f"{self.options.startup_timeout:g} s (env.options.startup_timeout); its output ends: {self._server_output()}"
        )

    def _server_output(self) -> str:
        self._server_log.seek(0)
        lines = self._server_log.read().decode(errors="replace").strip().splitlines()
        return " | ".join(lines[-5:]) or "(nothing)"

    def _http_json(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """The JSON answer of one HTTP request; None when the server has no such route (404, 405, 501).

        Raises:
            OpenEnvError: the server cannot be reached, timed out, failed, or answered non-JSON.
        """
        url = f"{self.base_url}{path}"
        try:
            response = self._client().request(method, path, json=body)
        except httpx.TimeoutException as exc:
            raise OpenEnvError(
                f"{method} {url} got no answer within {self.options.timeout:g} s (env.options.timeout)"
            ) from exc
        except httpx.HTTPError as exc:
            raise OpenEnvError(f"{method} {url} failed: {exc!r}; is the OpenEnv server running?") from exc
        if response.status_code in (404, 405, 501):
            return None
        if response.is_error:
            raise OpenEnvError(f"{method} {url} -> HTTP {response.status_code}: {response.text[:300]}")
        try:
            return response.json()
        except ValueError as exc:
            raise OpenEnvError(f"{method} {url} answered non-JSON: {response.text[:200]!r}") from exc

    @functools.cached_property
    def _action_field(self) -> str:
        """The action field the action text goes into: the option, else the action schema's one string field.

        Raises:
            EnvError: the schema has no single string field (the ``action_field`` option must name one).
            OpenEnvError: the server failed, or has no ``/schema``.
        """
        if self.options.action_field is not None:
            return self.options.action_field
        properties = {k: v for k, v in self._action_schema.get("properties", {}).items() if k != "metadata"}
        strings = [key for key, value in properties.items() if _is_string(value)]
        if len(strings) != 1:
            raise EnvError(
                f"the action schema of the OpenEnv server at {self.base_url} has fields {sorted(properties)} "
                f"({len(strings)} of them strings); set env.options.action_field to the one the model's text goes "
                "into (and env.options.action_defaults to fixed values of the others)"
            )
        return strings[0]

    @functools.cached_property
    def _action_schema(self) -> dict[str, Any]:
        """The server's action schema (``GET /schema``'s ``action``)."""
        schema = self._http_json("GET", "/schema")
        action = schema.get("action") if isinstance(schema, dict) else None
        if not isinstance(action, dict):
            raise OpenEnvError(
                f"GET {self.base_url}/schema answered {json.dumps(schema)[:200]}, without OpenEnv's action schema; "
                "set env.options.action_field"
            )
        return action

    @functools.cached_property
    def _schema_tools(self) -> tuple[str, tuple[Function, ...]]:
        """The action schema's call field and the functions its variants list.

        Raises:
            EnvError: no field of the action schema is a choice of calls.
        """
        defs = self._action_schema.get("$defs", {})
        for field, schema in self._action_schema.get("properties", {}).items():
            variants = _resolved(schema, defs).get("oneOf")
            names = [(v.get("properties") or {}).get("name") for v in variants or [] if isinstance(v, dict)]
            if (
                not variants
                or len(names) != len(variants)
                or not all(isinstance(n, dict) and "const" in n for n in names)
            ):
                continue
            try:
                functions = tuple(
                    Function(
                        name=name["const"],
                        description=name.get("description") or "",
                        parameters=_resolved(variant["properties"].get("arguments", {"type": "object"}), defs),
                    )
                    for name, variant in zip(names, variants, strict=True)
                )
            except pydantic.ValidationError as exc:
                raise OpenEnvError(
                    f"the action schema of the OpenEnv server at {self.base_url} lists calls in {field!r} that are "
                    f"not functions: {exc}"
                ) from exc
            return field, functions
        raise EnvError(
            f"the action schema of the OpenEnv server at {self.base_url} has no field that is a choice of calls "
            "({name: {const}, arguments} variants); set env.options.tools to mcp for an MCP environment, or leave "
            "it out to send text"
        )

    # ----------------------------------------------------------------------------------------------- the tasks

    @functools.cached_property
    def _splits(self) -> dict[str, list[int]]:
        """Every split's task ids, numbered in one sequence split after split (ids given as lists are kept)."""
        sizes: dict[str, list[int] | int] = dict(self.options.splits) or self._task_api_sizes()
        splits: dict[str, list[int]] = {}
        start = 0
        for split, size in sizes.items():
            ids = list(size) if isinstance(size, list) else list(range(start, start + size))
            splits[split] = ids
            start = max([start - 1, *ids]) + 1
        return splits

    def _task_api_sizes(self) -> dict[str, int]:
        """Each split's task count from the server's task API.

        Raises:
            EnvError: the server has no task API.
            OpenEnvError: the server failed, or answered outside the task API's shapes.
        """
        env_name = self.options.env_name
        if env_name is None:
            names = self._http_json("GET", "/list_environments")
            if not (isinstance(names, list) and names and isinstance(names[0], str)):
                raise self._no_task_api(f"GET /list_environments answered {json.dumps(names)[:200]}")
            env_name = names[0]
        splits = self._http_json("GET", f"/{env_name}/splits")
        if not isinstance(splits, list) or not splits:
            raise self._no_task_api(f"GET /{env_name}/splits answered {json.dumps(splits)[:200]}")
        sizes = {}
        for split in splits:
            name = split.get("name") if isinstance(split, dict) else None
            answer = self._http_json("POST", f"/{env_name}/num_tasks", {"split": name})
            count = answer.get("num_tasks") if isinstance(answer, dict) else None
            if not isinstance(name, str) or not isinstance(count, int) or isinstance(count, bool) or count < 0:
                raise OpenEnvError(
                    f"the task API of the OpenEnv server at {self.base_url} answered split {split!r} with "
                    f"{json.dumps(answer)[:200]}, not a split name and its task count"
                )
            sizes[name] = count
        return sizes

    def _no_task_api(self, answer: str) -> EnvError:
        return EnvError(
            f"the OpenEnv server at {self.base_url} has no task API ({answer}); list its tasks in env.options.splits, "
            "e.g. {train: 100, test: 20}"
        )

    @property
    def _reset_args(self) -> dict[str, Any]:
        if self.options.reset_args is not None:
            return self.options.reset_args
        return {"seed": "{task_id}"} if self.options.splits else {"split": "{split}", "index": "{index}"}

    def _locate(self, task_id: int) -> tuple[str, int]:
        """The split ``task_id`` is in and its position there."""
        for split, ids in self._splits.items():
            if task_id in ids:
                return split, ids.index(task_id)
        ranges = ", ".join(f"{split} {_span(ids)}" for split, ids in self._splits.items())
        raise EnvError(f"task id {task_id} is in no split of the OpenEnv server at {self.base_url} ({ranges})")

    # ---------------------------------------------------------------------------------------- the WebSocket session

    def _connect(self) -> Any:
        """The session's WebSocket, opened on first use (and again after a failure dropped it)."""
        if self._session is not None:
            return self._session
        try:
            from websockets.sync.client import connect
        except ImportError as exc:
            raise EnvError("env openenv needs the websockets package: pip install -e '.[openenv]'") from exc
        self._client()  # starts `command`'s server, which fills in the port of base_url
        parts = urlsplit(self.base_url)
        url = f"{'wss' if parts.scheme == 'https' else 'ws'}://{parts.netloc}{parts.path.rstrip('/')}/ws"
        # Proxy settings are for remote servers; a loopback one is reached directly.
        proxy = {"proxy": None} if parts.hostname in _LOOPBACK else {}
        try:
            self._session = connect(
                url,
                open_timeout=self.options.timeout,
                additional_headers=self._headers(),
                max_size=2**26,  # observations may hold pages or screenshots
                **proxy,
            )
        except Exception as exc:  # OSError, TimeoutError, and websockets' own InvalidHandshake family
            raise OpenEnvError(f"cannot open the OpenEnv session at {url}: {exc!r}; is the server running?") from exc
        return self._session

    def _drop_session(self) -> None:
        with contextlib.suppress(Exception):
            self._session.close()
        self._session = None
        self._episode = False

    def _exchange(self, kind: str, data: dict[str, Any]) -> dict[str, Any] | None:
        """Send one ``reset`` or ``step`` message and return its observation message's data; for a ``step`` the
        server refused for the action's shape, None (with the server's reason in ``_refusal``).

        Raises:
            OpenEnvError: no answer within ``timeout``, the session closed, or the answer is not OpenEnv's
                (the session is dropped: a late answer must not be read as the next one's).
        """
        session = self._connect()
        where = f"the OpenEnv server at {self.base_url}"
        try:
            session.send(json.dumps({"type": kind, "data": data}))
            raw = session.recv(timeout=self.options.timeout)
        except TimeoutError as exc:
            self._drop_session()
            raise OpenEnvError(
                f"{where} sent no answer to a {kind} within {self.options.timeout:g} s (env.options.timeout)"
            ) from exc
        except Exception as exc:  # websockets' ConnectionClosed family, or the socket's OSError
            self._drop_session()
            raise OpenEnvError(f"{where} closed the session during a {kind}: {exc!r}") from exc
        try:
            answer = json.loads(raw)
        except ValueError:
            answer = None
        if isinstance(answer, dict) and answer.get("type") == "error":
            error = answer.get("data") if isinstance(answer.get("data"), dict) else {}
            if kind == "step" and error.get("code") == "VALIDATION_ERROR":
                details = "; ".join(_validation_message(e) for e in error.get("errors") or []) or error.get("message")
                self._refusal = f"The environment refused the action: {details}"
                return None
            self._drop_session()
            raise OpenEnvError(f"{where} answered a {kind} with an error: {error.get('message', raw)}")
        body = answer.get("data") if isinstance(answer, dict) and answer.get("type") == "observation" else None
        if not (isinstance(body, dict) and isinstance(body.get("observation"), dict)):
            self._drop_session()
            raise OpenEnvError(f"{where} answered a {kind} with {str(raw)[:200]!r}, not an OpenEnv observation")
        return body

    def _text(self, data: dict[str, Any]) -> str:
        """The observation text: the ``observation_fields`` of the observation (see the option).

        Raises:
            OpenEnvError: the observation lacks a field the option names.
        """
        observation = data["observation"]
        fields = self.options.observation_fields or [k for k in observation if k not in _PROTOCOL_FIELDS]
        missing = [field for field in fields if field not in observation]
        if missing:
            raise OpenEnvError(
                f"the observation of the OpenEnv server at {self.base_url} has no field {missing[0]!r} (its fields: "
                f"{', '.join(observation)}); set env.options.observation_fields"
            )
        shown = [field for field in fields if observation[field] is not None] if len(fields) > 1 else fields
        if len(shown) == 1:
            return _as_text(observation[shown[0]])
        return "\n".join(f"{field}: {_as_text(observation[field])}" for field in shown)

    @functools.cached_property
    def _mcp_tools(self) -> tuple[Function, ...]:
        """The server's tools, from a ``list_tools`` action."""
        data = self._exchange("step", {"type": "list_tools"})
        tools = (data or {}).get("observation", {}).get("tools")
        try:
            return tuple(
                Function(name=t["name"], description=t.get("description") or "", parameters=t["input_schema"])
                for t in tools
            )
        except (TypeError, KeyError, pydantic.ValidationError) as exc:
            raise OpenEnvError(
                f"the OpenEnv server at {self.base_url} answered list_tools with {json.dumps(tools)[:200]}, not a "
                f"list of tools ({exc}); is it an MCP environment? Otherwise leave env.options.tools out"
            ) from exc


def _filled(value: Any, fill: dict[str, Any]) -> Any:
    """``value`` with the placeholders in ``fill`` replaced; a string that is one placeholder takes its value."""
    if not isinstance(value, str):
        return value
    if value in fill:
        return fill[value]
    for placeholder, replacement in fill.items():
        value = value.replace(placeholder, str(replacement))
    return value


def _resolved(schema: Any, defs: dict[str, Any]) -> dict[str, Any]:
    """``schema`` through an optional's ``anyOf`` with null and a ``$ref`` into ``$defs`` (pydantic's shapes)."""
    if not isinstance(schema, dict):
        return {}
    variants = [v for v in schema.get("anyOf", []) if isinstance(v, dict) and v.get("type") != "null"]
    if len(variants) == 1:
        schema = variants[0]
    ref = schema.get("$ref", "")
    return defs.get(ref.removeprefix("#/$defs/"), {}) if ref.startswith("#/$defs/") else schema


def _is_string(schema: Any) -> bool:
    """Whether a JSON Schema property is a string, or an optional one."""
    return _resolved(schema, {}).get("type") == "string"


def _metadata(data: dict[str, Any]) -> dict[str, Any]:
    metadata = data.get("metadata") or data["observation"].get("metadata") or {}
    return dict(metadata) if isinstance(metadata, dict) else {"metadata": metadata}


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _validation_message(error: Any) -> str:
    if not isinstance(error, dict):
        return str(error)
    where = ".".join(str(part) for part in error.get("loc", ()))
    return f"{where}: {error.get('msg', '')}" if where else str(error.get("msg", error))


def _span(ids: list[int]) -> str:
    if not ids:
        return "(none)"
    return f"{ids[0]}-{ids[-1]}" if ids == list(range(ids[0], ids[-1] + 1)) else f"{len(ids)} ids"


def _parent_death_signal() -> Callable[[], None] | None:
    """On Linux, a function that has the process calling it (a child, before its exec) sent SIGTERM when its parent
    dies (``prctl(PR_SET_PDEATHSIG)``); None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return functools.partial(prctl, 1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG


_DIE_WITH_PARENT = _parent_death_signal()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _stop(process: subprocess.Popen) -> None:
    """Stop ``process`` and every process of its group: SIGTERM, then SIGKILL to what is left after 5 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        process.poll()  # reaps the shell: a zombie leader would count as alive
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    process.wait()

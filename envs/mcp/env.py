"""``McpEnv``: the tools of an MCP server as an environment (``env.name: mcp``).

An episode is a task of a task file: its prompt is the first observation, each turn the agent calls one of the
server's tools (through the ``mcp`` SDK's client session) and reads the result, and the episode ends when the agent
answers or after ``max_turns`` turns. The reward function the options name then scores it.

Server
    A stdio server (``command``, ``args``, ``env``, ``cwd``: the env starts the process) or a running
    streamable-HTTP server (``url``, ``headers``). Each env instance holds one MCP session, opened at first use and
    kept across episodes, so a server's state carries over from one episode to the next unless ``reset_tool``
    names a tool that clears it. A server that exits, hangs or breaks the protocol makes the current step raise
    ``McpServerError`` (an ``EnvUnavailable``: the sampler replaces the env actor, retries the episode once, then
    records it as failed); the next ``reset`` starts a new server and session.

Tasks
    A JSON file holding a list of task objects, or a JSONL file (any other suffix) with one object a line. Each
    task has a ``prompt`` (the first observation), an optional ``split`` (a task without one is in every split)
    and whatever else its reward reads. Task id ``i`` is the ``i``-th task of the file, from 0 (blank lines of
    a JSONL file skipped).

Actions
    One tool call a turn, in either form (the first call of a reply is the one made)::

        Action: add {"a": 2, "b": 3}
        <tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>

    The arguments are checked against the tool's input schema before the call; a reply without a call, an unknown
    tool or arguments that do not fit get a message saying so instead. A tool that fails answers its error text,
    as MCP hosts show it. ``answer_tool`` (``answer``) ends the episode: when the server has no tool of that name
    it is the env's own function ``answer {"answer": "<text>"}`` (``Action: answer <text>`` works too), else the
    server's tool is called and the episode ends after it. With ``env.action_format: tools`` the same functions
    are offered as tools (``functions``).

Reward
    ``reward`` is ``module:function``, called once per episode when it ends with keyword arguments ``task`` (the
    task's object), ``messages`` (the episode's ``{"role", "content"}`` messages: the prompt, then each reply and
    the observation after it), ``tool_results`` (a :class:`ToolResult` per call made) and ``answer`` (the text of
    the env's own ``answer``; None otherwise). It returns a reward, or a ``(reward, success)`` pair; with a bare
    reward the episode succeeds when the reward is positive. Every other step's reward is 0.
"""

from __future__ import annotations

import inspect
import json
import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import structlog
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agentgym_rl.configs.targets import import_target
from agentgym_rl.envs.base import EnvError, InvalidAction, Observation, StepResult, TextEnv
from agentgym_rl.envs.mcp.session import McpConnection, McpServerError
from agentgym_rl.envs.tools import NAME_PATTERN, Function, ToolCall, function_named

log = structlog.get_logger()

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_MARKER = re.compile(r"action\s*:", re.IGNORECASE)
_PREAMBLE = "You solve a task with the tools of an MCP server."


class ToolResult(BaseModel):
    """One tool call of an episode and what the server answered: what a reward function reads."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="The tool called.")
    arguments: dict[str, Any] = Field(description="The arguments it was called with.")
    text: str = Field(description="The result as the agent read it: the text of its content blocks.")
    is_error: bool = Field(description="The tool failed (MCP's `isError`); `text` is its error.")
    structured: dict[str, Any] | None = Field(description="The tool's structured result, when it gives one.")


class McpEnv(TextEnv):
    """Call the tools of an MCP server to solve the tasks of a task file."""

    name = "mcp"

    class Options(BaseModel):
        """Options of the MCP env (`env.options`): one server (`command` or `url`), the tasks and the reward."""

        model_config = ConfigDict(extra="forbid")

        command: str | None = Field(
            None,
            description="Executable that starts a stdio MCP server, e.g. `python` or `npx` (a path, or a name on "
            "PATH); with `args`. Set this or `url`.",
        )
        args: list[str] = Field(default_factory=list, description="Arguments of `command`.")
        env: dict[str, str] | None = Field(
            None,
            description="Environment variables of the server process, added to the few the MCP SDK passes on "
            "(HOME, LOGNAME, PATH, SHELL, TERM, USER).",
        )
        cwd: str | None = Field(None, description="Working directory of the server process; None: the env's.")
        url: str | None = Field(
            None, description="Streamable-HTTP endpoint of a running MCP server, e.g. http://127.0.0.1:8000/mcp."
        )
        headers: dict[str, str] = Field(
            default_factory=dict, description="HTTP headers sent to `url`, e.g. {Authorization: 'Bearer ...'}."
        )
        tasks: Path = Field(
            description="Task file: a JSON list of task objects, or JSONL (one a line). Each task has a `prompt`, "
            "an optional `split` (none: every split) and what its reward reads; task id i is the i-th task."
        )
        reward: str = Field(
            description="`module:function` that scores an episode, called with keyword arguments task, messages, "
            "tool_results and answer; returns a reward or a (reward, success) pair. Its module must be importable "
            "by the env actors (on PYTHONPATH)."
        )
        tools: list[str] | None = Field(
            None, description="The server's tools the agent is offered, by name; None: all of them."
        )
        answer_tool: str = Field(
            "answer",
            pattern=NAME_PATTERN,
            description="The action that ends the episode: the server's tool of this name, else the env's own "
            "`answer` function with one string argument `answer`.",
        )
        reset_tool: str | None = Field(
            None,
            description="A tool of the server called with no arguments at every reset (e.g. one that clears its "
            "state), never offered to the agent; None: none.",
        )
        instruction: str = Field(
            _PREAMBLE, description="What the system prompt says first; the action syntax and the tools follow."
        )
        max_turns: int = Field(10, ge=1, description="Turns after which the episode ends and is scored.")
        start_timeout_s: float = Field(
            30.0, gt=0, description="Seconds for the server to start and list its tools before the env gives up."
        )
        call_timeout_s: float = Field(
            60.0, gt=0, description="Seconds one tool call may take; a server slower than that has failed."
        )

        @model_validator(mode="after")
        def _one_server(self) -> McpEnv.Options:
            if (self.command is None) == (self.url is None):
                both = "both" if self.command is not None else "neither"
                raise ValueError(
                    f"env.options sets {both} of `command` and `url`: give `command` (with `args`) for a stdio "
                    "MCP server the env starts, or `url` for a streamable-HTTP server that is running"
                )
            if self.url is not None and (self.args or self.env is not None or self.cwd is not None):
                raise ValueError("`args`, `env` and `cwd` describe a stdio server; with `url` leave them out")
            if self.command is not None and self.headers:
                raise ValueError("`headers` are sent to `url`; a stdio server (`command`) takes `env` instead")
            return self

    def __init__(self, **options: Any) -> None:
        self.options = self.Options(**options)
        self._tasks = load_tasks(self.options.tasks)
        self._reward = _reward_function(self.options.reward)
        self._connection: McpConnection | None = None
        self._offered: list[Function] = []  # the functions of the open connection
        self._answers_itself = True  # whether answer_tool is the env's own function (the server has no such tool)
        self.restarts = 0
        self._task: dict[str, Any] | None = None
        self._messages: list[dict[str, str]] = []
        self._results: list[ToolResult] = []
        self._turn = 0

    @property
    def instruction(self) -> str:
        """The ``instruction`` option, the action syntax and the offered functions with their argument schemas."""
        answer = self.options.answer_tool
        tools = "\n".join(f"- {_signature(f)}: {f.description.strip() or '(no description)'}" for f in self.functions())
        ending = (
            f'When you know the answer, reply Action: {answer} {{"answer": "<your answer>"}}; that ends the task.'
            if self._own_answer()
            else f"Calling {answer} ends the task."
        )
        return (
            f"{self.options.instruction}\n\n"
            "Each turn, think briefly, then call one tool by ending your reply with a line\n"
            "Action: <tool name> <arguments as a JSON object>\n"
            'or with <tool_call>{"name": "<tool name>", "arguments": {...}}</tool_call>. '
            f"The tool's result is your next observation.\n{ending}\n\nTools:\n{tools}"
        )

    @property
    def tool_instruction(self) -> str:
        """System prompt in ``env.action_format: tools``: the ``instruction`` option and how a task ends (the tool
        format lists the functions)."""
        answer = self.options.answer_tool
        ending = (
            f"When you know the answer, call {answer} with it; that ends the task."
            if self._own_answer()
            else f"Calling {answer} ends the task."
        )
        return f"{self.options.instruction}\n\nCall one tool a turn; its result is your next observation. {ending}"

    def tasks(self, split: str) -> Sequence[int]:
        """Ids of the tasks whose ``split`` is ``split`` or that name none."""
        ids = [i for i, task in enumerate(self._tasks) if task.get("split") in (None, split)]
        if not ids:
            named = sorted({str(task["split"]) for task in self._tasks if task.get("split") is not None})
            raise EnvError(
                f"no task of {self.options.tasks} is in split {split!r} (splits named there: {', '.join(named)}); "
                f'give tasks a "split": "{split}" field, or none to put a task in every split'
            )
        return ids

    def functions(self) -> list[Function]:
        """The server's tools (``tools`` of them, ``reset_tool`` left out), then the env's own answer function
        when the server has no ``answer_tool``; opens the session when none is open."""
        self._connected()
        return list(self._offered)

    def reset(self, task_id: int) -> Observation:
        """Start task ``task_id``: check that the server still answers (start a new one when not), call
        ``reset_tool`` if set, and show the task's prompt."""
        if isinstance(task_id, bool) or not isinstance(task_id, int) or not 0 <= task_id < len(self._tasks):
            raise EnvError(
                f"task id must be an integer in 0 .. {len(self._tasks) - 1} ({self.options.tasks}), got {task_id!r}"
            )
        connection = self._connected()
        try:
            connection.ping()
        except McpServerError as exc:
            log.warning("MCP server stopped answering; starting a new one", reason=str(exc))
            connection = self._connected()
        if self.options.reset_tool is not None:
            result = connection.call_tool(self.options.reset_tool, {})
            if result.isError:
                raise McpServerError(
                    f"{connection.label}: reset_tool {self.options.reset_tool!r} failed: {_result_text(result)}"
                )
        self._task = self._tasks[task_id]
        self._messages = [{"role": "user", "content": self._task["prompt"]}]
        self._results = []
        self._turn = 0
        return Observation(text=self._task["prompt"], info={"task_id": task_id, "server_restarts": self.restarts})

    def parse_action(self, model_text: str) -> str | InvalidAction:
        """The reply's tool call as ``<name> <JSON arguments>``, or why the reply holds none."""
        call = self._call_in(model_text)
        if isinstance(call, InvalidAction):
            return call
        name, arguments = call
        return f"{name} {json.dumps(arguments, ensure_ascii=False)}"

    def step(self, action_text: str) -> StepResult:
        """Make the reply's tool call through the MCP session and show its result; after the answer or the last
        turn, score the episode.

        Raises:
            McpServerError: the server exited, hung or broke the protocol (the next reset starts a new one).
            EnvError: no episode is running, or the reward function failed.
        """
        if self._task is None:
            raise EnvError("no episode is running; call reset first")
        self._turn += 1
        self._messages.append({"role": "assistant", "content": action_text})
        call = self._call_in(action_text)
        functions = self._offered
        answer, tool_error, ends = None, False, False
        if not isinstance(call, InvalidAction):
            call = _checked(functions, *call)
        if isinstance(call, InvalidAction):
            observation = call.reason
        elif call[0] == self.options.answer_tool and self._answers_itself:
            answer, ends = call[1]["answer"], True
            observation = "Answer received."
        else:
            name, arguments = call
            assert self._connection is not None
            result = self._connection.call_tool(name, arguments)
            tool_error, ends = result.isError, name == self.options.answer_tool
            observation = _result_text(result)
            self._results.append(
                ToolResult(
                    name=name,
                    arguments=arguments,
                    text=observation,
                    is_error=result.isError,
                    structured=result.structuredContent,
                )
            )
        self._messages.append({"role": "user", "content": observation})
        info: dict[str, Any] = {"action_valid": not isinstance(call, InvalidAction), "tool_error": tool_error}
        if not (ends or self._turn >= self.options.max_turns):
            return StepResult(observation=observation, reward=0.0, done=False, info=info)
        reward, success = self._score(answer)
        self._task = None
        return StepResult(observation=observation, reward=reward, done=True, info={**info, "success": success})

    def action_text(self, call: ToolCall) -> str:
        """``Action: <name> <JSON arguments>``, which :meth:`step` reads back as the same call."""
        return f"Action: {call.name} {call.arguments_json()}"

    def call_of_action(self, action: str) -> ToolCall | None:
        """The call an action text (``Action: <name> <JSON>`` or ``<tool_call>...``) makes; None when it makes none."""
        call = self._call_in(action)
        return None if isinstance(call, InvalidAction) else ToolCall(id="call_0", name=call[0], arguments=call[1])

    def close(self) -> None:
        """End the MCP session (a stdio server stops with it)."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _connected(self) -> McpConnection:
        """The open session; a new one (a new server) when none is open or the last one failed."""
        if self._connection is not None and not self._connection.broken:
            return self._connection
        if self._connection is not None:
            self._connection.close()
            self._connection = None
            self.restarts += 1
        options = self.options
        connection = McpConnection(
            command=options.command,
            args=options.args,
            env=options.env,
            cwd=options.cwd,
            url=options.url,
            headers=options.headers,
            start_timeout_s=options.start_timeout_s,
            call_timeout_s=options.call_timeout_s,
        )
        try:
            self._offered = self._functions(connection)
            self._answers_itself = all(tool.name != options.answer_tool for tool in connection.tools)
        except EnvError:
            connection.close()
            raise
        self._connection = connection
        return connection

    def _functions(self, connection: McpConnection) -> list[Function]:
        """What the agent is offered of ``connection``'s tools, checked against the options."""
        served = {tool.name: tool for tool in connection.tools}
        if missing := sorted(set(self.options.tools or []) - set(served)):
            raise EnvError(
                f"env.options.tools names {missing}, which {connection.label} does not offer; it offers: "
                f"{', '.join(sorted(served)) or 'no tools'}"
            )
        if self.options.reset_tool is not None and self.options.reset_tool not in served:
            raise EnvError(
                f"env.options.reset_tool {self.options.reset_tool!r} is not a tool of {connection.label}; it offers: "
                f"{', '.join(sorted(served)) or 'no tools'}"
            )
        offered = [
            tool
            for name, tool in served.items()
            if (self.options.tools is None or name in self.options.tools) and name != self.options.reset_tool
        ]
        functions = []
        for tool in offered:
            try:
                functions.append(
                    Function(name=tool.name, description=tool.description or "", parameters=tool.inputSchema)
                )
            except ValidationError as exc:
                raise EnvError(
                    f"tool {tool.name!r} of {connection.label} cannot be offered as a function "
                    f"({exc.errors()[0]['msg']}); leave it out with env.options.tools"
                ) from exc
        if function_named(functions, self.options.answer_tool) is None:
            functions.append(
                Function(
                    name=self.options.answer_tool,
                    description="Give your final answer; this ends the task.",
                    parameters={"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
                )
            )
        return functions

    def _own_answer(self) -> bool:
        """Whether ``answer_tool`` is the env's own function (the server had no tool of that name)."""
        self._connected()
        return self._answers_itself

    def _call_in(self, model_text: str) -> tuple[str, dict[str, Any]] | InvalidAction:
        """The (name, arguments) of the reply's first tool call, or why it has none."""
        if found := _TOOL_CALL.search(model_text):
            return _hermes_call(found.group(1))
        markers = list(_MARKER.finditer(model_text))
        if not markers:
            return InvalidAction(
                reason='No tool call found. End your reply with a line Action: <tool name> {"argument": value}.'
            )
        action = model_text[markers[-1].end() :].strip().strip("`").strip()
        # the name runs to the first space or brace: `add {"a": 1}`, `add{"a": 1}` and `answer 42` all read
        found = re.match(r"([^\s{]*)\s*(.*)", action, re.DOTALL)
        name, rest = found.group(1).strip("\"'`"), found.group(2).strip()
        if not name:
            return InvalidAction(reason='The action names no tool. Write Action: <tool name> {"argument": value}.')
        if not rest:
            return name, {}
        if not rest.startswith("{"):
            if name == self.options.answer_tool:
                return name, {"answer": rest.strip("\"'`")}
            return InvalidAction(
                reason=f'The arguments of {name} must be a JSON object, e.g. Action: {name} {{"argument": value}}.'
            )
        try:
            arguments, _ = json.JSONDecoder().raw_decode(rest)
        except json.JSONDecodeError as exc:
            return InvalidAction(
                reason=f"The arguments of {name} are not valid JSON: {exc.msg} at character {exc.pos}."
            )
        return name, arguments

    def _score(self, answer: str | None) -> tuple[float, bool]:
        """The reward function's (reward, success) for the episode that just ended."""
        assert self._task is not None
        target = self.options.reward
        try:
            value = self._reward(
                task=dict(self._task), messages=list(self._messages), tool_results=list(self._results), answer=answer
            )
        except Exception as exc:
            raise EnvError(f"reward function {target} raised {type(exc).__name__}: {exc}; fix it") from exc
        reward, success = value if isinstance(value, tuple) and len(value) == 2 else (value, None)
        if (
            isinstance(reward, bool)
            or not isinstance(reward, int | float)
            or not math.isfinite(reward)
            or not isinstance(success, bool | None)
        ):
            raise EnvError(
                f"reward function {target} returned {value!r}; it must return a finite number or a "
                "(number, bool) pair of reward and success"
            )
        return float(reward), reward > 0 if success is None else success


def load_tasks(path: Path) -> list[dict[str, Any]]:
    """The task objects of a JSON list or JSONL file, each checked to have a non-empty ``prompt``.

    Raises:
        EnvError: the file is missing, is not JSON or JSONL, or a task lacks a prompt.
    """
    if not path.is_file():
        raise EnvError(f"env.options.tasks: no task file at {path}; give a JSON list or JSONL file of tasks")
    text = path.read_text()
    if path.suffix == ".json":
        try:
            tasks = json.loads(text)
        except json.JSONDecodeError as exc:
            raise EnvError(f"task file {path} is not JSON: {exc}") from exc
        if not isinstance(tasks, list):
            raise EnvError(f"task file {path} must hold a JSON list of task objects, got a {type(tasks).__name__}")
        where = [f"task {i}" for i in range(len(tasks))]
    else:
        tasks, where = [], []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                tasks.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise EnvError(f"task file {path} line {number} is not JSON: {exc}") from exc
            where.append(f"line {number}")
    if not tasks:
        raise EnvError(f"task file {path} holds no tasks")
    for task, place in zip(tasks, where, strict=True):
        if not isinstance(task, dict) or not isinstance(task.get("prompt"), str) or not task["prompt"].strip():
            raise EnvError(f'task file {path}, {place}: a task is a JSON object with a non-empty "prompt" string')
        if not isinstance(task.get("split"), str | None):
            raise EnvError(f'task file {path}, {place}: "split" must be a string (train, test, ...)')
    return tasks


def _reward_function(target: str) -> Callable[..., Any]:
    """The function ``target`` names, checked to accept the reward's keyword arguments."""
    if ":" not in target:
        raise EnvError(f"env.options.reward {target!r} must look like 'module:function'")
    try:
        function = import_target(target)
    except ImportError as exc:
        raise EnvError(
            f"env.options.reward {target!r} cannot be imported: {exc}; put its module on PYTHONPATH (the env actors "
            "import it too)"
        ) from exc
    if not callable(function):
        raise EnvError(f"env.options.reward {target!r} is not a function")
    try:
        inspect.signature(function).bind(task={}, messages=[], tool_results=[], answer=None)
    except TypeError as exc:
        raise EnvError(
            f"env.options.reward {target!r} must accept keyword arguments task, messages, tool_results and answer "
            f"({exc})"
        ) from exc
    except ValueError:  # a builtin without a signature: found out at the first call
        pass
    return function


def _hermes_call(body: str) -> tuple[str, dict[str, Any]] | InvalidAction:
    """(name, arguments) of a ``<tool_call>`` body: ``{"name": ..., "arguments": {...}}``."""
    try:
        call = json.loads(body)
    except json.JSONDecodeError as exc:
        return InvalidAction(reason=f"The <tool_call> is not valid JSON: {exc.msg} at character {exc.pos}.")
    arguments = call.get("arguments", {}) if isinstance(call, dict) else None
    if isinstance(arguments, str):  # OpenAI's shape: the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            arguments = None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not isinstance(arguments, dict):
        return InvalidAction(
            reason='A <tool_call> holds {"name": "<tool name>", "arguments": {...}} with the arguments an object.'
        )
    return call["name"], arguments


def _checked(functions: list[Function], name: str, arguments: Any) -> tuple[str, dict[str, Any]] | InvalidAction:
    """The call when ``name`` is an offered function and ``arguments`` fit its schema, else why not."""
    function = function_named(functions, name)
    if function is None:
        return InvalidAction(
            reason=f"There is no tool {name!r}. The tools are: {', '.join(f.name for f in functions)}."
        )
    if not isinstance(arguments, dict):
        return InvalidAction(reason=f"The arguments of {name} must be a JSON object.")
    if (error := function.argument_error(arguments)) is not None:
        return InvalidAction(reason=f"Invalid {error}.")
    return name, arguments


def _signature(function: Function) -> str:
    """``name(a: number, b?: string)``: each argument with its type (``?``: optional); an argument whose schema
    says more than a plain type (an enum, an object, a list) is shown as its JSON Schema."""
    required = set(function.parameters.get("required", []))
    shown = []
    for name, schema in function.parameters.get("properties", {}).items():
        plain = {key: value for key, value in schema.items() if key not in ("title", "description")}
        kind = (
            plain["type"] if set(plain) == {"type"} and plain["type"] not in ("object", "array") else json.dumps(plain)
        )
        shown.append(f"{name}{'' if name in required else '?'}: {kind}")
    return f"{function.name}({', '.join(shown)})"


def _result_text(result: Any) -> str:
    """A ``CallToolResult`` as the agent reads it: its text blocks (a resource's text, a note for media), else its
    structured content as JSON."""
    parts = []
    for block in result.content:
        if block.type == "text":
            parts.append(block.text)
        elif block.type == "resource" and hasattr(block.resource, "text"):
            parts.append(block.resource.text)
        else:
            parts.append(f"[{block.type} content{f' ({block.mimeType})' if getattr(block, 'mimeType', None) else ''}]")
    if not parts and result.structuredContent is not None:
        parts.append(json.dumps(result.structuredContent))
    return "\n".join(parts) or "(no output)"

"""Tool calls as text: how a format shows functions to the model, how a reply writes calls and how their results
come back, and how calls are read out of sampled text.

A :class:`ToolFormat` is one model family's convention. The endpoint, the episode book and the trainer's rollouts
all reach it through :class:`ToolChat`, so a conversation with tools is rendered and parsed one way everywhere.
Formats are registered by name (``model.tool_format``); ``hermes`` ships: the convention of Qwen2.5/Qwen3 and the
Hermes models, used as the built-in template for models whose own chat template renders no tools (SmolLM2).

Messages here are OpenAI's chat messages with their content already text (``content`` parts joined): a dict with
``role`` (``system``, ``user``, ``assistant``, ``tool``) and ``content``; an assistant message may carry
``tool_calls`` (a list of :class:`~agentgym_rl.envs.tools.ToolCall`), a tool message carries ``tool_call_id``.
"""

from __future__ import annotations

import abc
import itertools
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import structlog

from agentgym_rl.actors.chat import ChatFormat, TemplateError
from agentgym_rl.configs.errors import AgentGymError
from agentgym_rl.configs.targets import import_target
from agentgym_rl.envs.tools import Function, ToolCall

log = structlog.get_logger()

Message = dict[str, Any]


class ToolFormatError(AgentGymError, ValueError):
    """An unknown tool format, or a conversation with tools that a format cannot render."""


@dataclass(frozen=True)
class ParsedReply:
    """A sampled reply read by a format.

    Attributes:
        content: the text outside the calls (None when there is none).
        calls: the calls, in the order written.
        error: set when the reply opened a call that does not parse; then ``calls`` is empty and ``content`` is
            the whole reply, returned as text.
    """

    content: str | None
    calls: list[ToolCall] = field(default_factory=list)
    error: str | None = None


def default_call_id(index: int) -> str:
    """``call_<index>``: ids for calls whose id nobody else chose (the trainer's own rollouts)."""
    return f"call_{index}"


class ToolFormat(abc.ABC):
    """One convention for tool calls in text. A subclass implements the four abstract methods; the conversion of
    OpenAI messages into plain ones (:meth:`plain_messages`) follows from them."""

    name: ClassVar[str] = ""
    call_opening: ClassVar[str] = ""
    """The text a call starts with in a reply: a streamed reply holds back text from here until it ends."""

    @abc.abstractmethod
    def tools_text(self, functions: Sequence[Function]) -> str:
        """The text the system message gains when ``functions`` are offered."""

    @abc.abstractmethod
    def call_text(self, content: str | None, calls: Sequence[ToolCall]) -> str:
        """An assistant reply that writes ``content`` (if any) and makes ``calls``, as the model writes it."""

    @abc.abstractmethod
    def results_text(self, results: Sequence[str]) -> str:
        """The user-side turn that answers a reply's calls with ``results``, in the calls' order."""

    @abc.abstractmethod
    def parse(self, text: str, call_id: Callable[[int], str] = default_call_id) -> ParsedReply:
        """The calls written in a sampled reply ``text``; ``call_id(i)`` names the i-th."""

    def plain_messages(self, messages: Sequence[Message], functions: Sequence[Function]) -> list[dict[str, str]]:
        """``messages`` as system/user/assistant messages of text, the way the built-in template shows them: the
        functions after the system prompt (in a system message of their own when there is none), each assistant
        call as :meth:`call_text`, and each run of ``tool`` messages as one user turn (:meth:`results_text`), with
        the text of a user message that follows it on a line of its own after the results.

        Raises:
            ToolFormatError: a ``tool`` message that does not follow an assistant message's calls.
        """
        plain: list[dict[str, str]] = []
        tools = self.tools_text(functions) if functions else ""
        if tools and (not messages or messages[0]["role"] != "system"):
            plain.append({"role": "system", "content": tools.lstrip()})
        pending: list[str] = []
        for index, message in enumerate(messages):
            role = message["role"]
            if role == "tool":
                if not pending and (not plain or plain[-1]["role"] != "assistant"):
                    raise ToolFormatError(f"message {index} is a tool result that follows no assistant tool call")
                pending.append(message["content"])
                continue
            if pending:
                results, pending = self.results_text(pending), []
                if role == "user":  # a user message right after the results joins their turn
                    plain.append({"role": "user", "content": f"{results}\n{message['content']}"})
                    continue
                plain.append({"role": "user", "content": results})
            if role == "system":
                plain.append({"role": "system", "content": message["content"] + (tools if index == 0 else "")})
            elif role == "assistant" and message.get("tool_calls"):
                plain.append(
                    {"role": "assistant", "content": self.call_text(message["content"], message["tool_calls"])}
                )
            else:
                plain.append({"role": role, "content": message["content"]})
        if pending:
            plain.append({"role": "user", "content": self.results_text(pending)})
        return plain

    def call_prefix(self, name: str | None = None) -> str:
        """The start of a reply that must make a call (``tool_choice: required``): the call opening; or that must
        call ``name``: that call as :meth:`call_text` writes it, up to its arguments. The model writes the rest."""
        if name is None:
            return self.call_opening
        written = self.call_text(None, [ToolCall(id=default_call_id(0), name=name, arguments={})])
        return written[: written.rindex("{}")]

    def content_end(self, text: str) -> int:
        """How much of a reply streamed so far is surely content: up to a call's opening, or up to a tail that
        could still grow into one."""
        at = text.find(self.call_opening)
        if at >= 0:
            return at
        for size in range(min(len(self.call_opening) - 1, len(text)), 0, -1):
            if self.call_opening.startswith(text[-size:]):
                return len(text) - size
        return len(text)


class HermesFormat(ToolFormat):
    """Functions as JSON lines inside ``<tools></tools>`` in the system prompt; a call as
    ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` in the reply (one block per call, several for
    parallel calls); results as ``<tool_response>...</tool_response>`` blocks in the next user turn."""

    name = "hermes"
    call_opening = "<tool_call>"
    _CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)

    def tools_text(self, functions: Sequence[Function]) -> str:
        listed = "\n".join(json.dumps(f.openai(), ensure_ascii=False) for f in functions)
        return (
            "\n\n# Tools\n\nThese functions can be called; their JSON schemas are listed in <tools></tools>:\n"
            f"<tools>\n{listed}\n</tools>\n\n"
            "To call one, reply with a JSON object holding its name and arguments inside <tool_call></tool_call>, "
            'one block per call:\n<tool_call>\n{"name": "<function name>", "arguments": {<arguments>}}\n</tool_call>'
        )

    def call_text(self, content: str | None, calls: Sequence[ToolCall]) -> str:
        blocks = [
            f'<tool_call>\n{{"name": {json.dumps(c.name)}, "arguments": {c.arguments_json()}}}\n</tool_call>'
            for c in calls
        ]
        return "\n".join([content, *blocks] if content else blocks)

    def results_text(self, results: Sequence[str]) -> str:
        return "\n".join(f"<tool_response>\n{result}\n</tool_response>" for result in results)

    def parse(self, text: str, call_id: Callable[[int], str] = default_call_id) -> ParsedReply:
        blocks = list(self._CALL.finditer(text))
        if not blocks:
            return ParsedReply(content=text or None)
        calls = []
        for index, block in enumerate(blocks):
            body = block.group(1).strip()
            try:
                data = json.loads(body)
            except ValueError as exc:
                return ParsedReply(content=text, error=f"tool call {index + 1} is not JSON ({exc}): {body[:200]!r}")
            if not isinstance(data, dict) or not isinstance(data.get("name"), str):
                return ParsedReply(content=text, error=f"tool call {index + 1} has no function name: {body[:200]!r}")
            arguments = data.get("arguments", {})
            if isinstance(arguments, str):  # some models write the arguments as a JSON string, as OpenAI sends them
                try:
                    arguments = json.loads(arguments)
                except ValueError:
                    arguments = None
            if not isinstance(arguments, dict):
                return ParsedReply(
                    content=text, error=f"tool call {index + 1}'s arguments are not a JSON object: {body[:200]!r}"
                )
            calls.append(ToolCall(id=call_id(index), name=data["name"], arguments=arguments))
        outside = text[: blocks[0].start()] + "".join(text[a.end() : b.start()] for a, b in itertools.pairwise(blocks))
        outside += text[blocks[-1].end() :]
        return ParsedReply(content=outside.strip() or None, calls=calls)


_FORMATS: dict[str, str] = {"hermes": f"{HermesFormat.__module__}:{HermesFormat.__name__}"}


def register_tool_format(name: str, fmt: type[ToolFormat]) -> None:
    """Make ``fmt`` selectable as ``model.tool_format: <name>``. Define it at the top level of an importable
    module: samplers and serve replicas in other processes import it by its path.

    Raises:
        ToolFormatError: ``fmt`` is not a ``ToolFormat`` subclass, or cannot be imported by its path.
    """
    if not (isinstance(fmt, type) and issubclass(fmt, ToolFormat)):
        raise ToolFormatError(f"register_tool_format({name!r}, {fmt!r}): not a subclass of ToolFormat")
    if fmt.__module__ == "__main__" or fmt.__qualname__ != fmt.__name__:
        raise ToolFormatError(
            f"register_tool_format({name!r}, {fmt.__qualname__}): define the class at the top level of an importable "
            "module, so that samplers and replicas can import it"
        )
    _FORMATS[name] = f"{fmt.__module__}:{fmt.__name__}"


def tool_format(name: str) -> ToolFormat:
    """The format ``name``: a registered name or a ``package.module:Class`` path.

    Raises:
        ToolFormatError: ``name`` is neither (the message lists the registered names).
    """
    target = _FORMATS.get(name, name if ":" in name else None)
    if target is None:
        raise ToolFormatError(f"unknown tool format {name!r}; registered: {', '.join(sorted(_FORMATS))}")
    try:
        found = import_target(target)
    except ImportError as exc:
        raise ToolFormatError(f"tool format {name!r} names {target!r}, which cannot be imported: {exc}") from exc
    if not (isinstance(found, type) and issubclass(found, ToolFormat)):
        raise ToolFormatError(f"tool format {name!r} names {target!r}, which is not a ToolFormat subclass")
    return found()


ToolTemplate = Literal["auto", "builtin", "model"]


class ToolChat:
    """Token ids of conversations with tools, for one tokenizer (its :class:`ChatFormat`) and one format.

    The opening (system prompt with the functions, first user message) is rendered either by the model's own chat
    template (given ``tools=``) or by the built-in one (:meth:`ToolFormat.plain_messages` through the plain
    template). Every later turn is appended as ids after the sampled reply: a user message, or the results of the
    reply's calls as the format's user-side turn. The history is never rendered again.

    Args:
        chat: the tokenizer's plain chat format.
        fmt: the tool format (the parser of sampled replies too).
        template: ``model``: the model's own template renders the opening, and must render call results the way
            the format appends them (checked here); ``builtin``: the format's plain conversion; ``auto``: the
            model's own when its template renders tools and passes that check, else the built-in one.

    Raises:
        TemplateError: ``template="model"`` and the model's template renders no tools, or renders a call's result
            differently from the turn appended after a reply.
    """

    def __init__(self, chat: ChatFormat, fmt: ToolFormat, template: ToolTemplate = "auto") -> None:
        self.chat = chat
        self.format = fmt
        problem = self._model_template_problem()
        if template == "model" and problem is not None:
            raise TemplateError(f"model.tool_template=model: {problem}; use `builtin` or `auto`")
        self.uses_model_template = template != "builtin" and problem is None
        if template == "auto" and problem is not None and "renders no tools" not in problem:
            log.warning(
                "the model's chat template renders tools but not turn by turn; using the built-in one", problem=problem
            )

    def prompt_ids(self, messages: Sequence[Message], functions: Sequence[Function]) -> list[int]:
        """Ids of the opening ``messages`` (and any turns after it, rendered whole: only for a client's own
        history, never for an episode's) followed by the assistant generation prompt."""
        if functions and self.uses_model_template:
            text = self.chat.tokenizer.apply_chat_template(
                [openai_message(m) for m in messages],
                tools=[f.openai() for f in functions],
                add_generation_prompt=True,
                tokenize=False,
            )
            return self.chat.encode(text)
        return self.chat.prompt_ids(self.format.plain_messages(messages, functions))

    def continuation_ids(self, sampled_ids: list[int], new: Sequence[Message]) -> list[int]:
        """Ids that close the sampled reply and open the next turn with ``new``: one user message, or the tool
        messages that answer the reply's calls (in order), then at most one user message (in the same turn).

        Raises:
            ToolFormatError: ``new`` is none of these.
        """
        return self.chat.continuation_ids(sampled_ids, self.turn_text(new))

    def turn_text(self, new: Sequence[Message]) -> str:
        """The user-side text of the turn that ``new`` adds (see :meth:`continuation_ids`)."""
        roles = [m["role"] for m in new]
        if roles == ["user"]:
            return new[0]["content"]
        results = len(roles) - (roles[-1:] == ["user"])  # the tool messages before a last user message
        if results and all(role == "tool" for role in roles[:results]):
            text = self.format.results_text([m["content"] for m in new[:results]])
            return f"{text}\n{new[-1]['content']}" if results < len(roles) else text
        raise ToolFormatError(
            f"a turn adds one user message, or the tool results of a reply's calls (then at most one user message), "
            f"not {roles}"
        )

    def _model_template_problem(self) -> str | None:
        """Why the model's own template cannot render an episode's openings with tools; None when it can."""
        tokenizer = self.chat.tokenizer
        if "tools" not in (tokenizer.chat_template or ""):
            return f"the chat template of {tokenizer.name_or_path!r} renders no tools"
        function = Function(
            name="probe_function", description="A probe.", parameters={"type": "object", "properties": {}}
        )
        call = ToolCall(id="call_0", name=function.name, arguments={})
        opening = [
            {"role": "system", "content": "\x1esystem-probe\x1e"},
            {"role": "user", "content": "\x1euser-probe\x1e"},
        ]
        reply = {"role": "assistant", "content": None, "tool_calls": [call]}
        result = {"role": "tool", "tool_call_id": call.id, "content": "\x1eresult-probe\x1e"}
        tools = [function.openai()]
        try:
            prompt = tokenizer.apply_chat_template(opening, tools=tools, add_generation_prompt=True, tokenize=False)
            whole = tokenizer.apply_chat_template(
                [openai_message(m) for m in (*opening, reply, result)],
                tools=tools,
                add_generation_prompt=True,
                tokenize=False,
            )
        except Exception as exc:  # noqa: BLE001 -- a template raises whatever its jinja code raises
            return f"the chat template of {tokenizer.name_or_path!r} fails on a tool call ({type(exc).__name__}: {exc})"
        expected = (
            prompt
            + self.format.call_text(None, [call])
            + self.chat.turn_separator
            + self.format.results_text([result["content"]])
            + self.chat.user_suffix
        )
        if whole != expected:
            return (
                f"the chat template of {tokenizer.name_or_path!r} renders a call and its result differently from the "
                f"{self.format.name} format's reply and the result turn appended after it"
            )
        return None


def openai_message(message: Message) -> dict[str, Any]:
    """A message in the form chat templates read (``tool_calls`` as OpenAI's dicts, arguments parsed)."""
    out = {k: v for k, v in message.items() if k != "tool_calls"}
    if message.get("tool_calls"):
        out["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in message["tool_calls"]
        ]
    return out

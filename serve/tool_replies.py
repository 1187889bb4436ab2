"""Replies of requests with tools: what a request's tools ask of the generation, and a sampled reply read as
OpenAI's ``tool_calls`` (whole, or streamed as content deltas and then call deltas).

The episode book's calls read their replies with :func:`tool_reply` too, so a reply is the same message
whichever route it takes.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from agentgym_rl.actors.tool_formats import ToolFormat
from agentgym_rl.envs.tools import Function, ToolCall
from agentgym_rl.serve.text import ReplyText

ARGUMENT_PIECE_CHARS = 32  # a streamed call's arguments go out in pieces of at most this many characters


def new_call_id(index: int) -> str:
    """``call_<24 hex>``: a fresh id for the ``index``-th call of a reply (unique across replies), as OpenAI's APIs
    name calls."""
    del index  # the ids are random; the index only orders them
    return f"call_{uuid.uuid4().hex[:24]}"


def new_tool_use_id(index: int) -> str:
    """``toolu_<24 hex>``: a fresh id for the ``index``-th call of a reply, as Anthropic's Messages API names them."""
    del index
    return f"toolu_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class ToolUse:
    """What a chat request's tools ask of its generation.

    Attributes:
        functions: the functions shown to the model.
        parse: read replies as calls (off without tools, and with ``tool_choice: none``).
        prefix: text put at the start of the reply, which the model continues (``required``: the format's call
            opening; a named function: the opening and the function's name); it is part of the text read.
        parallel: return every call of a reply (False: its first only).
        call_ids: names the i-th call of a reply (the API's own id form).
    """

    functions: list[Function] = field(default_factory=list)
    parse: bool = False
    prefix: str = ""
    parallel: bool = True
    call_ids: Callable[[int], str] = new_call_id


NO_TOOLS = ToolUse()  # a request without tools: replies are text


@dataclass(frozen=True)
class ToolReply:
    """A sampled reply as OpenAI's assistant message.

    Attributes:
        content: the text (with calls: the text outside them, None when there is none).
        calls: the calls made (ids ``call_<hex>``, or the request's own form: ``ToolUse.call_ids``).
        finish_reason: ``tool_calls`` when there are calls, else the generation's own.
        error: why a reply that opened a call is returned as text (None otherwise).
    """

    content: str | None
    calls: list[ToolCall]
    finish_reason: Literal["stop", "length", "tool_calls"]
    error: str | None = None


def tool_reply(
    fmt: ToolFormat,
    text: str,
    finish_reason: Literal["stop", "length"],
    *,
    parallel: bool = True,
    call_ids: Callable[[int], str] = new_call_id,
) -> ToolReply:
    """Read the reply ``text`` (a forced prefix included) with ``fmt``: its calls (named by ``call_ids``), or the
    text as it is when it makes none or opened a call that does not parse (then ``error`` says why)."""
    parsed = fmt.parse(text, call_id=call_ids)
    if parsed.error is not None or not parsed.calls:
        return ToolReply(text, [], finish_reason, parsed.error)
    return ToolReply(parsed.content, parsed.calls if parallel else parsed.calls[:1], "tool_calls")


class ToolReplyText:
    """The streamed text of one choice of a request that reads calls: content goes out as soon as it surely is
    content (up to a call's opening, or a tail that could still become one; blank text once more text follows
    it), the calls once the choice ends. The content streamed equals the whole reply's unless the reply starts
    with blank text and then makes calls (the whole reply's content is stripped; the stream sent that blank).

    Args:
        reply: the choice's text as its tokens arrive (stop strings cut).
        fmt: the tool format the reply is read with.
        use: the request's tools (its forced prefix starts the text).
        shown: characters of that prefix the client already has (an assistant prefill it sent), never sent again.
    """

    def __init__(self, reply: ReplyText, fmt: ToolFormat, use: ToolUse, shown: int = 0) -> None:
        self.reply, self.format, self.use = reply, fmt, use
        self.known = use.prefix  # the reply's text so far, as far as stop strings allow
        self.sent = shown  # characters of it sent as content (or held by the client already)

    def push(self, token_ids: tuple[int, ...] | list[int]) -> str:
        """Add sampled ids; returns the new content that is now safe to send (maybe empty)."""
        self.known += self.reply.push(token_ids)
        # Blank text goes out once more content follows it: a reply's content ends stripped when calls follow.
        return self._emit(len(self.known[: self.format.content_end(self.known)].rstrip()))

    def finish(self, finish_reason: Literal["stop", "length"]) -> tuple[str, ToolReply]:
        """Once the choice ended: the content not sent yet, and the reply read whole."""
        self.known += self.reply.finish()
        result = tool_reply(
            self.format, self.known, finish_reason, parallel=self.use.parallel, call_ids=self.use.call_ids
        )
        if not result.calls:
            return self._emit(len(self.known)), result
        # The content before the first call went out as it came; the text the parse finds outside the calls after
        # it (between or after them) follows. The whole reply strips the content's edges: so does this, except
        # for blank text the reply started with (sent before anyone could know that calls follow).
        sent, content = self.known[: self.sent].lstrip(), result.content or ""
        return (content[len(sent) :] if content.startswith(sent) else ""), result

    def _emit(self, end: int) -> str:
        piece = self.known[self.sent : end]
        self.sent = max(self.sent, end)
        return piece


def argument_pieces(call: ToolCall) -> list[str]:
    """The call's arguments string in the pieces a stream sends them in."""
    text = call.arguments_json()
    return [text[at : at + ARGUMENT_PIECE_CHARS] for at in range(0, len(text), ARGUMENT_PIECE_CHARS)]

"""The Anthropic Messages API on the policy endpoint (``POST /v1/messages``): what agents written against the
``anthropic`` SDK call, served by the same renderer, tool format and episode book as the chat route.

A request's ``system``, turns and blocks become the shared message form (``actors.tool_formats``): a user turn's
``tool_result`` blocks are ``tool`` messages answering the previous reply's ``tool_use`` calls, its text a user
message after them; an assistant turn is its text and calls. Its ``tools`` are functions shown in
``model.tool_format``, and a reply's calls come back as ``tool_use`` blocks with ids ``toolu_<hex>``. A last
assistant turn is a prefill: the reply continues its text, and only the new text is returned, as Anthropic's API
does.

An episode's calls carry its token in the ``X-Episode-Token`` header or ``metadata.user_id: "episode:<token>"``;
the book records them exactly as it records chat calls.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import replace
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from agentgym_rl.actors.engines import ChoiceDelta, CompletionRequest, SamplingParams
from agentgym_rl.envs.tools import ToolCall
from agentgym_rl.serve.anthropic_bodies import (
    AssistantTurn,
    MessageOut,
    MessagesRequest,
    MessagesUsage,
    StopReason,
    TextBlock,
    TextOut,
    ToolUseBlock,
    ToolUseOut,
)
from agentgym_rl.serve.deployment import StreamStart
from agentgym_rl.serve.episodes import token_of
from agentgym_rl.serve.errors import APIError, sse_error
from agentgym_rl.serve.policy_api import EPISODE_HEADER, EpisodeRecorder, PolicyAPI, sampling_params
from agentgym_rl.serve.text import ReplyText
from agentgym_rl.serve.tool_replies import ToolReply, ToolReplyText, ToolUse, argument_pieces, new_tool_use_id


def conversation(body: MessagesRequest) -> tuple[list[dict[str, Any]], str]:
    """``body``'s conversation in the shared message form, and its prefill: the text of a last assistant turn,
    which the reply continues ("" when the last turn is the user's).

    Raises:
        APIError: 400 for a ``tool_result`` that answers none of the previous reply's calls, or a last assistant
            turn that makes calls (their results are due, not a continuation).
    """
    turns = list(body.messages)
    prefill = ""
    if isinstance(turns[-1], AssistantTurn):
        last = blocks_of(turns[-1].content)
        if any(isinstance(block, ToolUseBlock) for block in last):
            raise APIError(
                400,
                f"messages[{len(turns) - 1}] is an assistant turn with tool_use blocks; answer its calls in a user "
                "turn of tool_result blocks (only a text assistant turn may end the conversation, as a prefill)",
                param=f"messages.{len(turns) - 1}.content",
            )
        prefill = "".join(block.text for block in last if isinstance(block, TextBlock))
        turns.pop()
    system = body.system_text()
    messages: list[dict[str, Any]] = [] if system is None else [{"role": "system", "content": system}]
    answerable: list[str] = []  # the ids of the calls the next tool_result may answer
    for index, turn in enumerate(turns):
        blocks = blocks_of(turn.content)
        if isinstance(turn, AssistantTurn):
            texts = [block.text for block in blocks if isinstance(block, TextBlock)]
            calls = [ToolCall(id=b.id, name=b.name, arguments=b.input) for b in blocks if isinstance(b, ToolUseBlock)]
            # content None beside calls (as the chat route reads a reply that only made calls), "" for an empty turn
            text = "\n".join(texts) if texts else (None if calls else "")
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if calls:
                message["tool_calls"] = calls
            messages.append(message)
            answerable = [call.id for call in calls]
            continue
        texts, results = [], 0
        for position, block in enumerate(blocks):
            where = f"messages.{index}.content.{position}"
            if isinstance(block, TextBlock):
                texts.append(block.text)
                continue
            if block.tool_use_id not in answerable:
                made = f"made {answerable}" if answerable else "made none"
                raise APIError(
                    400,
                    f"{where} answers tool call {block.tool_use_id!r}, but the assistant turn before it {made}: each "
                    "tool_result answers a tool_use of the assistant turn just before",
                    param=f"{where}.tool_use_id",
                )
            messages.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": block.text()})
            results += 1
        if texts or not results:
            messages.append({"role": "user", "content": "\n".join(texts)})
        answerable = []
    return messages, prefill


def blocks_of(content: str | list) -> list:
    """A turn's content as blocks (a string is one text block)."""
    return [TextBlock(type="text", text=content)] if isinstance(content, str) else content


def stop_of(calls: list[ToolCall], finish_reason: str | None, reply: ReplyText) -> tuple[StopReason, str | None]:
    """Anthropic's ``stop_reason`` and ``stop_sequence`` of a reply."""
    if calls:
        return "tool_use", None
    if finish_reason == "length":
        return "max_tokens", None
    hit = reply.stop_hit()
    return ("stop_sequence", hit) if hit is not None else ("end_turn", None)


def event(name: str, data: dict[str, Any]) -> str:
    return f"event: {name}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


class MessagesAPI:
    """``POST /v1/messages`` on one replica, through the replica's :class:`PolicyAPI` (limits, rendering, the
    engine, the episode book)."""

    def __init__(self, api: PolicyAPI) -> None:
        self.api = api

    def sampling(self, body: MessagesRequest) -> SamplingParams:
        """The engine settings of a request, once its model id and token cap are checked (400/404)."""
        self.api.check_model(body.model)
        return sampling_params(
            temperature=body.temperature,
            top_p=body.top_p,
            top_k=body.top_k,
            max_new_tokens=self.api.token_cap(body.max_tokens, "max_tokens"),
            stop=body.stop_sequences,
        )

    def tool_use(self, body: MessagesRequest) -> ToolUse:
        """What ``body``'s tools ask of the generation (:meth:`PolicyAPI.choose_tools`): ``auto`` and ``none`` as
        named, ``any`` a compulsory call, ``tool`` a call of the tool it names; calls get ids ``toolu_<hex>``."""
        choice = body.tool_choice
        kind = "auto" if choice is None else choice.type
        return self.api.choose_tools(
            [tool.function() for tool in body.tools or ()],
            kind if kind in ("auto", "none") else "forced",
            name=getattr(choice, "name", None),
            parallel=not getattr(choice, "disable_parallel_tool_use", False),
            name_param="tool_choice.name",
            call_ids=new_tool_use_id,
        )

    async def respond(self, request: Request, body: MessagesRequest) -> MessageOut | StreamingResponse:
        """The reply to ``body``: a message, or its event stream; a call of an episode is recorded."""
        api = self.api
        params = self.sampling(body)
        use = self.tool_use(body)
        messages, prefill = conversation(body)
        token = token_of(request.headers.get(EPISODE_HEADER), body.episode_user())
        if token is not None:
            # A prefill goes to the book as the assistant message it is: no call of an episode may end with one (409).
            if prefill:
                messages.append({"role": "assistant", "content": prefill})
            await api.require_model()

            async def answer(request: CompletionRequest, recording: EpisodeRecorder | None):
                return await self.answer(body, request, use, "", recording)

            return await api.episode_call(token, messages, params, use, body.seed, answer)
        # The reply continues the prefill (and then opens the call that tool_choice makes compulsory).
        use = replace(use, prefix=prefill + use.prefix) if prefill else use
        prompt = api.prompt(messages, use.functions, use.prefix)
        await api.require_model()
        return await self.answer(
            body, CompletionRequest(prompt_ids=prompt, params=params, seed=body.seed), use, prefill
        )

    async def answer(
        self,
        body: MessagesRequest,
        request: CompletionRequest,
        use: ToolUse,
        prefill: str,
        recording: EpisodeRecorder | None = None,
    ) -> MessageOut | StreamingResponse:
        """Generate from ``request``: the whole message, or its stream; ``recording`` keeps an episode's reply."""
        api = self.api
        if body.stream:
            weights_version, stream = await api.open_stream(request)
            events = self.events(request, weights_version, stream, use, prefill, recording)
            return api.stream_response(events, stream, recording)
        result = await api.policy.generate(request)
        choice = result.choices[0]
        reply = api.reply(request)
        reply.push(choice.token_ids)
        message = api.tool_message(use, use.prefix + reply.text, choice.finish_reason)
        content = shown(message, prefill)
        stop_reason, stop_sequence = stop_of(message.calls, choice.finish_reason, reply)
        if recording is not None:
            await recording.record(
                choice.token_ids, choice.logprobs, result.weights_version, choice.finish_reason, content, message.calls
            )
        blocks: list[TextOut | ToolUseOut] = [TextOut(text=content)] if content else []
        blocks += [ToolUseOut(id=call.id, name=call.name, input=call.arguments) for call in message.calls]
        return MessageOut(
            id=new_message_id(),
            model=api.model_id,
            content=blocks,
            stop_reason=stop_reason,
            stop_sequence=stop_sequence,
            usage=MessagesUsage(input_tokens=len(request.prompt_ids), output_tokens=len(choice.token_ids)),
            weights_version=result.weights_version,
        )

    async def events(
        self,
        request: CompletionRequest,
        weights_version: int,
        stream: AsyncGenerator[StreamStart | list[ChoiceDelta], None],
        use: ToolUse,
        prefill: str,
        recorder: EpisodeRecorder | None,
    ) -> AsyncIterator[str]:
        """Anthropic's events: ``message_start``; a text block (start, ``text_delta`` s as the text is surely text,
        stop) when the reply has text; per call a ``tool_use`` block (start with empty input, its input as
        ``input_json_delta`` pieces, stop); ``message_delta`` with the stop reason and the sampled tokens;
        ``message_stop``. An episode's reply is recorded before ``message_delta``; a failure after the 200 ends the
        stream with an ``error`` event."""
        api = self.api
        reply = api.reply(request)
        reader = ToolReplyText(reply, api.format, use, shown=len(prefill)) if use.parse else None
        sampled: list[int] = []
        logprobs: list[float] = []
        finish_reason: str | None = None
        read: ToolReply | None = None
        text_open = False
        try:
            opening = MessageOut(
                id=new_message_id(),
                model=api.model_id,
                content=[],
                stop_reason=None,
                usage=MessagesUsage(input_tokens=len(request.prompt_ids), output_tokens=0),
                weights_version=weights_version,
            )
            yield event("message_start", {"type": "message_start", "message": opening.model_dump(mode="json")})
            async for deltas in stream:
                for delta in deltas:
                    sampled += delta.token_ids
                    logprobs += delta.logprobs
                    text = reader.push(delta.token_ids) if reader is not None else reply.push(delta.token_ids)
                    if delta.finish_reason is not None:
                        finish_reason = delta.finish_reason
                        if reader is not None:
                            rest, read = reader.finish(delta.finish_reason)
                            text += rest
                            api.counted(read)
                        else:
                            text += reply.finish()
                    if text and not text_open:
                        text_open = True
                        block = {"type": "text", "text": ""}
                        yield event(
                            "content_block_start", {"type": "content_block_start", "index": 0, "content_block": block}
                        )
                    if text:
                        delta_body = {"type": "text_delta", "text": text}
                        yield event(
                            "content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta_body}
                        )
            if text_open:
                yield event("content_block_stop", {"type": "content_block_stop", "index": 0})
            calls = read.calls if read is not None else []
            for index, call in enumerate(calls, start=int(text_open)):
                block = {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
                yield event(
                    "content_block_start", {"type": "content_block_start", "index": index, "content_block": block}
                )
                for piece in argument_pieces(call):
                    delta_body = {"type": "input_json_delta", "partial_json": piece}
                    yield event(
                        "content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta_body}
                    )
                yield event("content_block_stop", {"type": "content_block_stop", "index": index})
            if recorder is not None:
                whole = read if read is not None else ToolReply(use.prefix + reply.text, [], "stop")
                await recorder.record(sampled, logprobs, weights_version, finish_reason, shown(whole, prefill), calls)
            stop_reason, stop_sequence = stop_of(calls, finish_reason, reply)
            yield event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                    "usage": {"output_tokens": len(sampled)},
                },
            )
            yield event("message_stop", {"type": "message_stop"})
        except Exception as exc:  # noqa: BLE001 -- the status (200) is sent already; the stream ends with the error
            yield sse_error(exc, anthropic=True)


def shown(message: ToolReply, prefill: str) -> str | None:
    """The reply's text as the client gets it: a prefill the client sent is not returned again."""
    content = message.content
    if prefill and content is not None and content.startswith(prefill):
        return content[len(prefill) :]
    return content


def new_message_id() -> str:
    return f"msg_{uuid.uuid4().hex[:24]}"

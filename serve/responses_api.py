"""OpenAI's Responses API on the policy endpoint (``POST /v1/responses``): what agents written against the
``openai`` SDK's ``client.responses`` (and OpenAI's Agents SDK) call, served by the same renderer, tool format and
episode book as the chat route.

The endpoint is stateless: a request's ``input`` is the whole conversation (``previous_response_id`` and
``conversation`` are refused), and nothing is stored. Its ``instructions`` and items become the shared message form
(``actors.tool_formats``): ``instructions`` a system message first, a ``developer`` message a system one,
``function_call`` items an assistant message's calls (joining the assistant message item just before them, if there
is one), ``function_call_output`` items ``tool`` messages answering them. Its function ``tools`` are shown in
``model.tool_format``, and a reply comes back as a ``message`` item with its text and a ``function_call`` item per
call, with ids ``call_<hex>``.

An episode's calls carry its token in the ``X-Episode-Token`` header or ``user: "episode:<token>"``; the book
records them exactly as it records chat calls.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from agentgym_rl.actors.engines import ChoiceDelta, CompletionRequest, SamplingParams
from agentgym_rl.envs.tools import ToolCall
from agentgym_rl.serve.deployment import StreamStart
from agentgym_rl.serve.episodes import token_of
from agentgym_rl.serve.errors import APIError
from agentgym_rl.serve.policy_api import EPISODE_HEADER, EpisodeRecorder, PolicyAPI, sampling_params
from agentgym_rl.serve.responses_bodies import (
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionToolChoiceOut,
    FunctionToolOut,
    IncompleteDetails,
    OutputItem,
    ResponseFunctionCallItem,
    ResponseMessageItem,
    ResponseOut,
    ResponseOutputText,
    ResponsesRequest,
    ResponsesUsage,
    joined,
)
from agentgym_rl.serve.tool_replies import ToolReply, ToolReplyText, ToolUse, argument_pieces


def conversation(body: ResponsesRequest) -> list[dict[str, Any]]:
    """``body``'s ``instructions`` and ``input`` in the shared message form.

    Raises:
        APIError: 400 for a ``function_call_output`` that answers none of the calls of the assistant message its
            run of outputs follows.
    """
    messages: list[dict[str, Any]] = []
    if body.instructions is not None:
        messages.append({"role": "system", "content": body.instructions})
    answerable: list[str] = []  # the ids of the calls the next function_call_output may answer
    for index, item in enumerate(body.items()):
        if isinstance(item, FunctionCallItem):
            call = ToolCall(id=item.call_id, name=item.name, arguments=item.parsed_arguments())
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":  # the calls of one reply, after its text
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            answerable = [call.id for call in messages[-1]["tool_calls"]]
        elif isinstance(item, FunctionCallOutputItem):
            if item.call_id not in answerable:
                made = f"made {answerable}" if answerable else "made none"
                raise APIError(
                    400,
                    f"input[{index}] answers call {item.call_id!r}, but the assistant message before it {made}: each "
                    "function_call_output follows the function_call items (or the outputs answering them) whose "
                    "`call_id` it names",
                    param=f"input.{index}.call_id",
                )
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.text()})
        else:
            role = "system" if item.role == "developer" else item.role
            messages.append({"role": role, "content": joined(item.content)})
            answerable = []
    return messages


def new_response_id() -> str:
    return f"resp_{uuid.uuid4().hex}"


def new_message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


def new_item_id() -> str:
    return f"fc_{uuid.uuid4().hex}"


class ResponsesAPI:
    """``POST /v1/responses`` on one replica, through the replica's :class:`PolicyAPI` (limits, rendering, the
    engine, the episode book)."""

    def __init__(self, api: PolicyAPI) -> None:
        self.api = api

    def sampling(self, body: ResponsesRequest) -> SamplingParams:
        """The engine settings of a request, once its model id and token cap are checked (400/404)."""
        self.api.check_model(body.model)
        return sampling_params(
            temperature=body.temperature,
            top_p=body.top_p,
            max_new_tokens=self.api.token_cap(body.max_output_tokens, "max_output_tokens"),
        )

    def tool_use(self, body: ResponsesRequest) -> ToolUse:
        """What ``body``'s tools ask of the generation (:meth:`PolicyAPI.choose_tools`): ``auto`` and ``none`` as
        named, ``required`` a compulsory call, a named function a call of it."""
        choice = body.tool_choice or "auto"
        return self.api.choose_tools(
            [tool.function() for tool in body.tools or ()],
            choice if choice in ("auto", "none") else "forced",
            name=None if isinstance(choice, str) else choice.name,
            parallel=body.parallel_tool_calls is not False,
            name_param="tool_choice.name",
        )

    async def respond(self, request: Request, body: ResponsesRequest) -> ResponseOut | StreamingResponse:
        """The reply to ``body``: a response, or its event stream; a call of an episode is recorded."""
        api = self.api
        params = self.sampling(body)
        use = self.tool_use(body)
        messages = conversation(body)
        token = token_of(request.headers.get(EPISODE_HEADER), body.user)
        if token is not None:
            await api.require_model()

            async def answer(request: CompletionRequest, recording: EpisodeRecorder | None):
                return await self.answer(body, request, use, recording)

            return await api.episode_call(token, messages, params, use, body.seed, answer)
        prompt = api.prompt(messages, use.functions, use.prefix, param="input")
        await api.require_model()
        return await self.answer(body, CompletionRequest(prompt_ids=prompt, params=params, seed=body.seed), use)

    async def answer(
        self,
        body: ResponsesRequest,
        request: CompletionRequest,
        use: ToolUse,
        recording: EpisodeRecorder | None = None,
    ) -> ResponseOut | StreamingResponse:
        """Generate from ``request``: the whole response, or its stream; ``recording`` keeps an episode's reply."""
        api = self.api
        if body.stream:
            weights_version, stream = await api.open_stream(request)
            events = self.events(body, request, weights_version, stream, use, recording)
            return api.stream_response(events, stream, recording)
        result = await api.policy.generate(request)
        choice = result.choices[0]
        reply = api.reply(request)
        reply.push(choice.token_ids)
        message = api.tool_message(use, use.prefix + reply.text, choice.finish_reason)
        if recording is not None:
            await recording.record(
                choice.token_ids,
                choice.logprobs,
                result.weights_version,
                choice.finish_reason,
                message.content,
                message.calls,
            )
        text_id = new_message_id() if message.content or not message.calls else None
        output = output_items(message, text_id, [new_item_id() for _ in message.calls])
        usage = usage_of(len(request.prompt_ids), len(choice.token_ids))
        return self.response(body, new_response_id(), int(time.time()), result.weights_version, output, message, usage)

    def response(
        self,
        body: ResponsesRequest,
        ident: str,
        created_at: int,
        weights_version: int,
        output: list[OutputItem],
        message: ToolReply | None,
        usage: ResponsesUsage | None,
    ) -> ResponseOut:
        """The response to ``body`` with ``output``: finished when ``message`` (the reply read whole) is given,
        ``in_progress`` while it is None; the request's settings come back in it, their defaults filled in."""
        incomplete = message is not None and message.finish_reason == "length"
        choice = body.tool_choice or "auto"
        return ResponseOut(
            id=ident,
            created_at=created_at,
            status="in_progress" if message is None else "incomplete" if incomplete else "completed",
            incomplete_details=IncompleteDetails() if incomplete else None,
            instructions=body.instructions,
            max_output_tokens=body.max_output_tokens,
            model=self.api.model_id,
            output=output,
            parallel_tool_calls=body.parallel_tool_calls is not False,
            temperature=1.0 if body.temperature is None else body.temperature,
            tool_choice=choice if isinstance(choice, str) else FunctionToolChoiceOut(name=choice.name),
            tools=[
                FunctionToolOut(name=t.name, description=t.description, parameters=t.parameters, strict=t.strict)
                for t in body.tools or ()
            ],
            top_p=1.0 if body.top_p is None else body.top_p,
            metadata=body.metadata or {},
            usage=usage,
            weights_version=weights_version,
        )

    async def events(
        self,
        body: ResponsesRequest,
        request: CompletionRequest,
        weights_version: int,
        stream: AsyncGenerator[StreamStart | list[ChoiceDelta], None],
        use: ToolUse,
        recorder: EpisodeRecorder | None,
    ) -> AsyncIterator[str]:
        """The Responses API's events, each with its ``sequence_number``: ``response.created`` and
        ``response.in_progress``; the text's ``message`` item (``output_item.added``, ``content_part.added``,
        ``output_text.delta`` s as the text is surely text, then its ``done`` events) when the reply has text or
        makes no call; per call a ``function_call`` item (added with empty arguments, its arguments as
        ``function_call_arguments.delta`` pieces, done); then ``response.completed`` (or ``response.incomplete``
        when the token cap cut the reply) with the whole response. An episode's reply is recorded before that
        last event; a failure after the 200 ends the stream with an ``error`` event."""
        api = self.api
        reply = api.reply(request)
        reader = ToolReplyText(reply, api.format, use) if use.parse else None
        ident, created_at, text_id = new_response_id(), int(time.time()), new_message_id()
        sequence = 0
        sampled: list[int] = []
        logprobs: list[float] = []
        finish_reason: str | None = None
        read: ToolReply | None = None
        text_open = False

        def event(kind: str, **data: Any) -> str:
            nonlocal sequence
            payload = {"type": kind, "sequence_number": sequence, **data}
            sequence += 1
            return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"

        def opened() -> list[str]:
            item = ResponseMessageItem(id=text_id, status="in_progress", content=[]).model_dump(mode="json")
            part = ResponseOutputText(text="").model_dump(mode="json")
            return [
                event("response.output_item.added", output_index=0, item=item),
                event("response.content_part.added", item_id=text_id, output_index=0, content_index=0, part=part),
            ]

        try:
            started = self.response(body, ident, created_at, weights_version, [], None, None).model_dump(mode="json")
            yield event("response.created", response=started)
            yield event("response.in_progress", response=started)
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
                        for opening in opened():
                            yield opening
                    if text:
                        yield event(
                            "response.output_text.delta",
                            item_id=text_id,
                            output_index=0,
                            content_index=0,
                            delta=text,
                            logprobs=[],
                        )
            whole = read if read is not None else ToolReply(reply.text, [], finish_reason or "stop")
            if not whole.calls and not text_open:  # a reply without text or calls is an empty message
                text_open = True
                for opening in opened():
                    yield opening
            output = output_items(whole, text_id if text_open else None, [new_item_id() for _ in whole.calls])
            if text_open:
                part = output[0].content[0]
                yield event(
                    "response.output_text.done",
                    item_id=text_id,
                    output_index=0,
                    content_index=0,
                    text=part.text,
                    logprobs=[],
                )
                yield event(
                    "response.content_part.done",
                    item_id=text_id,
                    output_index=0,
                    content_index=0,
                    part=part.model_dump(mode="json"),
                )
                yield event("response.output_item.done", output_index=0, item=output[0].model_dump(mode="json"))
            for index, (item, call) in enumerate(zip(output[text_open:], whole.calls, strict=True), start=text_open):
                opening = item.model_copy(update={"arguments": "", "status": "in_progress"}).model_dump(mode="json")
                yield event("response.output_item.added", output_index=index, item=opening)
                for piece in argument_pieces(call):
                    yield event(
                        "response.function_call_arguments.delta", item_id=item.id, output_index=index, delta=piece
                    )
                yield event(
                    "response.function_call_arguments.done",
                    item_id=item.id,
                    output_index=index,
                    name=item.name,
                    arguments=item.arguments,
                )
                yield event("response.output_item.done", output_index=index, item=item.model_dump(mode="json"))
            if recorder is not None:
                await recorder.record(sampled, logprobs, weights_version, finish_reason, whole.content, whole.calls)
            usage = usage_of(len(request.prompt_ids), len(sampled))
            done = self.response(body, ident, created_at, weights_version, output, whole, usage)
            kind = "response.incomplete" if done.status == "incomplete" else "response.completed"
            yield event(kind, response=done.model_dump(mode="json"))
        except Exception as exc:  # noqa: BLE001 -- the status (200) is sent already; the stream ends with the error
            yield event("error", code="internal_error", message=f"generation failed: {exc}", param=None)


def output_items(message: ToolReply, text_id: str | None, call_item_ids: list[str]) -> list[OutputItem]:
    """A reply's output items: with ``text_id``, a ``message`` item of its text (``incomplete`` when the token cap
    cut it); a ``function_call`` item per call, with the item ids given."""
    items: list[OutputItem] = []
    if text_id is not None:
        status = "incomplete" if message.finish_reason == "length" else "completed"
        text = ResponseOutputText(text=message.content or "")
        items.append(ResponseMessageItem(id=text_id, status=status, content=[text]))
    items += [
        ResponseFunctionCallItem(
            id=item_id, call_id=call.id, name=call.name, arguments=call.arguments_json(), status="completed"
        )
        for item_id, call in zip(call_item_ids, message.calls, strict=True)
    ]
    return items


def usage_of(input_tokens: int, output_tokens: int) -> ResponsesUsage:
    return ResponsesUsage(
        input_tokens=input_tokens, output_tokens=output_tokens, total_tokens=input_tokens + output_tokens
    )

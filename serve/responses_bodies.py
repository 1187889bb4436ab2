"""Request and response bodies of OpenAI's Responses API (``POST /v1/responses``), as far as this server serves it:
text and function calling (``message``, ``function_call`` and ``function_call_output`` items, function tools). The
endpoint is stateless: nothing is stored, so a request sends the whole conversation as its ``input``. Every field or
value it does not serve (a stored response to continue, other item, content or tool types, structured outputs,
reasoning) is a 400 that names it."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag, field_validator

from agentgym_rl.serve.bodies import ArgumentsText, Body, FunctionSpec, OptionalWholeNumber, distinct_names

STATELESS = (
    "this endpoint stores no responses or conversations (it is stateless): send the whole conversation as `input`"
)
ITEM_TYPES = ("message", "function_call", "function_call_output")
ItemStatus = Literal["in_progress", "completed", "incomplete"]


def _refuse_unless_null(field: str) -> Any:
    # The field is declared as null only, and a value gets this message rather than pydantic's "should be None".
    def check(value: Any) -> Any:
        if value is not None:
            raise ValueError(f"`{field}` is not served: {STATELESS}")
        return value

    return BeforeValidator(check)


def _text_parts(*served: str) -> Any:
    # Before the union is tried, so that an image or a file part gets one clear message, not a union's errors.
    def check(content: Any) -> Any:
        for index, part in enumerate(content if isinstance(content, list) else ()):
            if isinstance(part, dict) and part.get("type") not in served:
                raise ValueError(
                    f"content part {index} has type {part.get('type')!r}; this server serves {' and '.join(served)} "
                    "parts here (no images, files, audio or refusals)"
                )
        return content

    return BeforeValidator(check)


class InputTextPart(Body):
    type: Literal["input_text"] = Field(description="A text part.")
    text: str = Field(description="The text.")


class OutputTextPart(Body):
    type: Literal["output_text"] = Field(description="A text part of an earlier reply, as the endpoint returned it.")
    text: str = Field(description="The text.")
    annotations: list[dict[str, Any]] | None = Field(None, description="Accepted and ignored.")
    logprobs: list[dict[str, Any]] | None = Field(None, description="Accepted and ignored.")


AssistantPart = Annotated[InputTextPart | OutputTextPart, Field(discriminator="type")]


class InputMessageItem(Body):
    type: Literal["message"] | None = Field(None, description="`message`, or left out.")
    role: Literal["user", "system", "developer"] = Field(
        description="Who wrote it; `developer` (OpenAI's name for the system prompt) is read as `system`."
    )
    content: Annotated[str | list[InputTextPart], _text_parts("input_text")] = Field(
        description="Text, or `input_text` parts (joined with newlines)."
    )
    status: ItemStatus | None = Field(None, description="Accepted and ignored.")


class AssistantMessageItem(Body):
    type: Literal["message"] | None = Field(None, description="`message`, or left out.")
    role: Literal["assistant"] = Field(description="An earlier reply, as the endpoint returned it.")
    content: Annotated[str | list[AssistantPart], _text_parts("output_text", "input_text")] = Field(
        description="Text, or `output_text` (or `input_text`) parts, joined with newlines."
    )
    id: str | None = Field(None, description="The item's id (`msg_...`); accepted and ignored.")
    status: ItemStatus | None = Field(None, description="Accepted and ignored.")
    phase: Literal["commentary", "final_answer"] | None = Field(None, description="Accepted and ignored.")


MessageItem = Annotated[InputMessageItem | AssistantMessageItem, Field(discriminator="role")]


class FunctionCallItem(Body):
    type: Literal["function_call"] = Field(description="A call an earlier reply made, as the endpoint returned it.")
    call_id: str = Field(description="The call's id (`call_...`), which the `function_call_output` answering it names.")
    name: str = Field(description="The function called.")
    arguments: ArgumentsText = Field(description="The arguments: a JSON object, encoded as a string.")
    id: str | None = Field(None, description="The item's id (`fc_...`); accepted and ignored.")
    status: ItemStatus | None = Field(None, description="Accepted and ignored.")

    def parsed_arguments(self) -> dict[str, Any]:
        return json.loads(self.arguments)


class FunctionCallOutputItem(Body):
    type: Literal["function_call_output"] = Field(description="The result of a call an earlier item made.")
    call_id: str = Field(description="The id of the call this answers.")
    output: Annotated[str | list[InputTextPart], _text_parts("input_text")] = Field(
        description="The result: text, or `input_text` parts (joined with newlines)."
    )
    id: str | None = Field(None, description="Accepted and ignored.")
    status: ItemStatus | None = Field(None, description="Accepted and ignored.")

    def text(self) -> str:
        return joined(self.output)


def _item_kind(item: Any) -> str:
    """Which kind of input item ``item`` is: its ``type``; a message may leave it out."""
    kind = item.get("type") if isinstance(item, dict) else getattr(item, "type", None)
    return kind or "message"


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")],
    Discriminator(
        _item_kind,
        custom_error_type="invalid_item",
        custom_error_message="an input item is a message, a function_call or a function_call_output",
    ),
]


def _input_kind(value: Any) -> str | None:
    """Whether ``input`` is text or items (None: neither, a 400 that says what it may be)."""
    if isinstance(value, str):
        return "text"
    return "items" if isinstance(value, list) else None


def _served_items(items: Any) -> Any:
    # Before the union is tried: a reasoning item or an item reference gets one clear message.
    for index, item in enumerate(items if isinstance(items, list) else ()):
        if isinstance(item, dict) and item.get("type") not in (None, *ITEM_TYPES):
            reason = STATELESS if item.get("type") == "item_reference" else "no reasoning, built-in tool or MCP items"
            raise ValueError(
                f"input item {index} has type {item.get('type')!r}; this server serves {', '.join(ITEM_TYPES)} "
                f"items ({reason})"
            )
    return items


class FunctionTool(FunctionSpec):
    type: Literal["function"] = Field(description="A function the model may call (the only tool type served).")


def _function_tools(tools: Any) -> Any:
    for index, tool in enumerate(tools if isinstance(tools, list) else ()):
        if isinstance(tool, dict) and tool.get("type") != "function":
            raise ValueError(
                f"tool {index} has type {tool.get('type')!r}; only function tools (`type: function`) are served: "
                "no built-in tools (web or file search, code interpreter, computer use, ...), MCP or custom tools"
            )
    return tools


class FunctionToolChoice(Body):
    type: Literal["function"] = Field(description="Call a function.")
    name: str = Field(description="A function among `tools`.")


def _function_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") != "function":
        raise ValueError(
            f"tool_choice of type {choice.get('type')!r} is not served; use 'auto', 'none', 'required' or "
            '{"type": "function", "name": ...}'
        )
    return choice


class PlainTextFormat(Body):
    type: Literal["text"] = Field(description="Plain text (the only format served).")


def _plain_text(config: Any) -> Any:
    if isinstance(config, dict) and isinstance(config.get("format"), dict) and config["format"].get("type") != "text":
        raise ValueError(
            f"text.format of type {config['format'].get('type')!r} (structured outputs) is not served yet; leave "
            "`format` out or send {'type': 'text'}"
        )
    return config


class TextConfig(Body):
    format: PlainTextFormat | None = Field(None, description="Only `{'type': 'text'}` is served.")
    verbosity: Literal["low", "medium", "high"] | None = Field(
        None, description="Accepted and ignored: a policy has one way of answering."
    )


def _no_reasoning(config: Any) -> Any:
    if isinstance(config, dict) and (config.get("effort") not in (None, "none") or config.get("summary") is not None):
        raise ValueError(
            "reasoning is not served (the policy writes no reasoning items); leave `reasoning` out or send "
            "{'effort': 'none'}"
        )
    return config


class ReasoningOff(Body):
    effort: Literal["none"] | None = Field(None, description="`none` (or null): no reasoning, the only setting.")
    summary: None = Field(None, description="Only null: there is no reasoning to summarize.")


def _nothing_included(include: Any) -> Any:
    if isinstance(include, list) and include:
        raise ValueError(
            f"include asks for {include!r:.200}, which this server does not return (no log-probabilities, "
            "reasoning or tool results in output items); send an empty list or leave `include` out"
        )
    return include


# The rules between fields that the validators and routes check, in the request schema too (see
# ``serve.bodies.CHAT_RULES``).
RESPONSES_RULES = [
    {  # a call made compulsory (`required`, or one function named) needs tools to call
        "if": {
            "properties": {"tool_choice": {"anyOf": [{"const": "required"}, {"type": "object"}]}},
            "required": ["tool_choice"],
        },
        "then": {"properties": {"tools": {"type": "array", "minItems": 1}}, "required": ["tools"]},
    },
]


class ResponsesRequest(Body):
    """The Responses API fields this server honours; ``null`` means the default, as in OpenAI's API."""

    model_config = ConfigDict(json_schema_extra={"allOf": RESPONSES_RULES})

    model: str = Field(description="Served model id (see GET /v1/models).")
    input: Annotated[
        Annotated[str, Tag("text")]
        | Annotated[list[InputItem], Field(min_length=1), BeforeValidator(_served_items), Tag("items")],
        Discriminator(
            _input_kind, custom_error_type="invalid_input", custom_error_message="input is text or a list of items"
        ),
    ] = Field(
        description="The whole conversation: a user message as text, or items: messages (`role` user, system, "
        "developer or assistant; `type: message` or none), and the `function_call` items earlier replies made with "
        "the `function_call_output` items answering them. Earlier replies go back as the endpoint returned them."
    )
    instructions: str | None = Field(None, description="The system prompt, put before `input`.")
    tools: Annotated[list[FunctionTool] | None, BeforeValidator(_function_tools)] = Field(
        None,
        description="Functions the model may call, shown to it in the model's tool format (`model.tool_format`); a "
        "reply that calls them comes back with `function_call` items.",
    )
    tool_choice: Annotated[
        Literal["none", "auto", "required"] | FunctionToolChoice | None, BeforeValidator(_function_choice)
    ] = Field(
        None,
        description="`auto` (the default): the model calls functions or writes text; `none`: the functions are "
        "still shown but the reply is returned as text; `required`: the reply starts with a call (the format's "
        'call opening is put at its start); `{"type": "function", "name": ...}`: the reply calls that function.',
    )
    parallel_tool_calls: bool | None = Field(
        None, description="Whether a reply may make several calls (default true); false returns its first call only."
    )
    max_output_tokens: OptionalWholeNumber = Field(
        None, ge=1, description="Cap on generated tokens (default: the server cap)."
    )
    temperature: float | None = Field(
        None,
        ge=0.0,
        le=2.0,
        description="Sampling temperature (default 1); 0, or anything below 1e-5, picks the likeliest token.",
    )
    top_p: float | None = Field(
        None, gt=0.0, le=1.0, description="Nucleus sampling mass (default 1); below 1e-5 picks the likeliest token."
    )
    stream: bool | None = Field(
        None, description="Send the Responses API's server-sent events (`response.created` ... `response.completed`)."
    )
    store: bool | None = Field(
        None,
        description="Accepted; nothing is stored either way (the endpoint is stateless, `input` is the whole "
        "conversation).",
    )
    previous_response_id: Annotated[None, _refuse_unless_null("previous_response_id")] = Field(
        None, description="Only null: the endpoint stores no responses; send the whole conversation as `input`."
    )
    conversation: Annotated[None, _refuse_unless_null("conversation")] = Field(
        None, description="Only null: the endpoint stores no conversations; send the whole conversation as `input`."
    )
    text: Annotated[TextConfig | None, BeforeValidator(_plain_text)] = Field(
        None, description="`format` may only be plain text (structured outputs are not served yet)."
    )
    reasoning: Annotated[ReasoningOff | None, BeforeValidator(_no_reasoning)] = Field(
        None, description="Only null or `{'effort': 'none'}`: the policy writes no reasoning."
    )
    include: Annotated[list[str] | None, BeforeValidator(_nothing_included)] = Field(
        None, max_length=0, description="Only empty: nothing optional is returned (OpenAI's Agents SDK sends `[]`)."
    )
    metadata: dict[str, str] | None = Field(None, description="Returned with the response as it was sent.")
    user: str | None = Field(
        None,
        description="`episode:<token>` tags the call with an episode opened by `POST /v1/episodes` (as the "
        "`X-Episode-Token` header does); anything else is accepted and ignored.",
    )
    seed: OptionalWholeNumber = Field(
        None, description="Not in OpenAI's API (send it with `extra_body`): same seed, same request, same reply."
    )

    @field_validator("tools")
    @classmethod
    def _distinct_names(cls, tools: list[FunctionTool] | None) -> list[FunctionTool] | None:
        distinct_names([tool.name for tool in tools or ()], "function in `tools`")
        return tools

    def items(self) -> list[InputMessageItem | AssistantMessageItem | FunctionCallItem | FunctionCallOutputItem]:
        """``input`` as items (text is one user message)."""
        if isinstance(self.input, str):
            return [InputMessageItem(role="user", content=self.input)]
        return list(self.input)


def joined(content: str | list[InputTextPart | OutputTextPart]) -> str:
    """Text, or text parts joined with newlines."""
    if isinstance(content, str):
        return content
    return "\n".join(part.text for part in content)


# ---------------------------------------------------------------------------------------------------- responses


class ResponseOutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[dict[str, Any]] = Field(default_factory=list, description="Always empty.")


class ResponseMessageItem(BaseModel):
    id: str = Field(description="`msg_<hex>`.")
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: ItemStatus = Field(description="`incomplete` when the token cap cut the reply.")
    content: list[ResponseOutputText]


class ResponseFunctionCallItem(BaseModel):
    id: str = Field(description="`fc_<hex>`: the item's id.")
    type: Literal["function_call"] = "function_call"
    call_id: str = Field(description="`call_<hex>`: the id a `function_call_output` answering the call names.")
    name: str
    arguments: str = Field(description="The arguments as a JSON object encoded as a string.")
    status: ItemStatus


OutputItem = Annotated[ResponseMessageItem | ResponseFunctionCallItem, Field(discriminator="type")]


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"] = Field("max_output_tokens", description="The token cap cut the reply.")


class InputTokensDetails(BaseModel):
    cached_tokens: int = Field(0, description="Always 0: prefix reuse is the engine's own and not counted.")
    cache_write_tokens: int = Field(0, description="Always 0.")


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = Field(0, description="Always 0: the policy writes no reasoning.")


class ResponsesUsage(BaseModel):
    input_tokens: int = Field(description="Prompt tokens.")
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int = Field(description="Sampled tokens.")
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int


class PlainTextOut(BaseModel):
    type: Literal["text"] = "text"


class TextConfigOut(BaseModel):
    format: PlainTextOut = Field(default_factory=PlainTextOut)


class FunctionToolOut(BaseModel):
    type: Literal["function"] = "function"
    name: str
    description: str | None
    parameters: dict[str, Any] | None
    strict: bool | None


class FunctionToolChoiceOut(BaseModel):
    type: Literal["function"] = "function"
    name: str


class ResponseOut(BaseModel):
    """The reply: an OpenAI ``Response`` (with the weights version that sampled it, beside OpenAI's fields); the
    request's settings come back in it as OpenAI's API returns them."""

    id: str = Field(description="`resp_<hex>`.")
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["in_progress", "completed", "incomplete"] = Field(
        description="`incomplete` when the token cap cut the reply (`incomplete_details` says so); `in_progress` "
        "in a stream's first events."
    )
    error: None = Field(None, description="Always null: a failure is an error status, or a stream's `error` event.")
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None
    max_output_tokens: int | None
    model: str
    output: list[OutputItem] = Field(
        description="A `message` item with the reply's text (absent when the reply only made calls), then a "
        "`function_call` item per call."
    )
    parallel_tool_calls: bool
    previous_response_id: None = None
    temperature: float | None
    text: TextConfigOut = Field(default_factory=TextConfigOut)
    tool_choice: Literal["none", "auto", "required"] | FunctionToolChoiceOut
    tools: list[FunctionToolOut]
    top_p: float | None
    truncation: Literal["disabled"] = Field("disabled", description="A prompt over the server's limit is a 400.")
    metadata: dict[str, str] = Field(default_factory=dict)
    usage: ResponsesUsage | None = Field(description="Token counts (null in a stream's first events).")
    weights_version: int = Field(description="The policy weights version that sampled this reply.")

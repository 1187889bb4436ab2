"""Request and response bodies of the Anthropic Messages API (``POST /v1/messages``), as far as this server serves
it: text and client tools (``tool_use`` / ``tool_result`` blocks), no images, documents, server tools or extended
thinking, each of which is a 400 that names it."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, field_validator, model_validator

from agentgym_rl.envs.tools import NAME_PATTERN, Function
from agentgym_rl.serve.bodies import Body, OptionalWholeNumber, WholeNumber, distinct_names

CACHE_CONTROL = "Accepted for compatibility and not acted on: the engine reuses every cached prefix by itself."


class CacheControl(Body):
    type: Literal["ephemeral"] = Field(description="The only kind of cache breakpoint.")
    ttl: str | None = Field(None, description="Accepted and ignored.")


class TextBlock(Body):
    type: Literal["text"] = Field(description="A text block.")
    text: str = Field(description="The text.")
    cache_control: CacheControl | None = Field(None, description=CACHE_CONTROL)
    citations: list[dict[str, Any]] | None = Field(None, description="Accepted and ignored.")


class ToolUseBlock(Body):
    type: Literal["tool_use"] = Field(description="A call an earlier reply made, as the endpoint returned it.")
    id: str = Field(description="The call's id (`toolu_...`), which the `tool_result` answering it names.")
    name: str = Field(description="The tool called.")
    input: dict[str, Any] = Field(description="The call's arguments.")
    cache_control: CacheControl | None = Field(None, description=CACHE_CONTROL)


class ToolResultBlock(Body):
    type: Literal["tool_result"] = Field(description="The result of one call of the assistant message before it.")
    tool_use_id: str = Field(description="The id of the call this answers.")
    content: str | list[TextBlock] | None = Field(None, description="The result: text or text blocks (joined).")
    is_error: bool | None = Field(None, description="Accepted; the result's text is shown as it is.")
    cache_control: CacheControl | None = Field(None, description=CACHE_CONTROL)

    def text(self) -> str:
        return joined(self.content) or ""


def _served_blocks(*served: str) -> Any:
    # Before the union is tried, so that an image or a thinking block gets one clear message, not a union's errors.
    def check(content: Any) -> Any:
        for index, block in enumerate(content if isinstance(content, list) else ()):
            if isinstance(block, dict) and block.get("type") not in served:
                raise ValueError(
                    f"block {index} has type {block.get('type')!r}; this server serves {', '.join(served)} blocks "
                    "in this role's messages (no images, documents, server tools or thinking)"
                )
        return content

    return BeforeValidator(check)


UserBlock = Annotated[TextBlock | ToolResultBlock, Field(discriminator="type")]
AssistantBlock = Annotated[TextBlock | ToolUseBlock, Field(discriminator="type")]


class UserTurn(Body):
    role: Literal["user"] = Field(description="A user turn: text, or the results of the previous reply's calls.")
    content: Annotated[str | list[UserBlock], _served_blocks("text", "tool_result")] = Field(
        description="Text, or blocks: `tool_result` blocks first (one per call answered), then any text."
    )


class AssistantTurn(Body):
    role: Literal["assistant"] = Field(
        description="An earlier reply as the endpoint returned it; as the last message, the start of the reply "
        "(the model continues that text)."
    )
    content: Annotated[str | list[AssistantBlock], _served_blocks("text", "tool_use")] = Field(
        description="Text, or `text` and `tool_use` blocks."
    )


MessageParam = Annotated[UserTurn | AssistantTurn, Field(discriminator="role")]


class CustomTool(Body):
    type: Literal["custom"] | None = Field(None, description="Only client tools (with `input_schema`) are served.")
    name: str = Field(pattern=NAME_PATTERN, description="Tool name (letters, digits, `_`, `-`; at most 64).")
    description: str | None = Field(None, description="What the tool does, for the model to read.")
    input_schema: dict[str, Any] = Field(
        json_schema_extra={"required": ["type"], "properties": {"type": {"const": "object"}}},
        description="JSON Schema of the tool's input: a valid schema of `type: object`.",
    )
    cache_control: CacheControl | None = Field(None, description=CACHE_CONTROL)
    strict: bool | None = Field(None, description="Accepted for compatibility; the input is not constrained.")
    eager_input_streaming: bool | None = Field(None, description="Accepted and ignored.")

    @field_validator("input_schema")
    @classmethod
    def _object_schema(cls, schema: dict[str, Any]) -> dict[str, Any]:
        try:
            Function(name="tool", parameters=schema)
        except ValidationError as exc:
            raise ValueError(exc.errors()[0]["msg"].removeprefix("Value error, ")) from None
        return schema

    def function(self) -> Function:
        return Function(name=self.name, description=self.description or "", parameters=self.input_schema)


def _client_tools(tools: Any) -> Any:
    for index, tool in enumerate(tools if isinstance(tools, list) else ()):
        if isinstance(tool, dict) and tool.get("type") not in (None, "custom"):
            raise ValueError(
                f"tool {index} has type {tool.get('type')!r}; only client tools (a `name` and an `input_schema`, "
                "type `custom` or none) are served"
            )
    return tools


class ToolChoiceAuto(Body):
    type: Literal["auto"] = Field(description="The model calls tools or writes text (the default with tools).")
    disable_parallel_tool_use: bool | None = Field(None, description="True: a reply's first call only.")


class ToolChoiceAny(Body):
    type: Literal["any"] = Field(description="The reply calls one of the tools (the call opening starts it).")
    disable_parallel_tool_use: bool | None = Field(None, description="True: a reply's first call only.")


class ToolChoiceTool(Body):
    type: Literal["tool"] = Field(description="The reply calls the named tool.")
    name: str = Field(description="A tool among `tools`.")
    disable_parallel_tool_use: bool | None = Field(None, description="True: a reply's first call only.")


class ToolChoiceNone(Body):
    type: Literal["none"] = Field(description="The tools are still shown, but the reply is returned as text.")


ToolChoice = Annotated[ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone, Field(discriminator="type")]


class Metadata(Body):
    user_id: str | None = Field(
        None, description="`episode:<token>` tags the call with an episode (as the `X-Episode-Token` header does)."
    )


def _no_thinking(thinking: Any) -> Any:
    if isinstance(thinking, dict) and thinking.get("type") != "disabled":
        raise ValueError("extended thinking is not served; leave `thinking` out or send {'type': 'disabled'}")
    return thinking


class ThinkingDisabled(Body):
    type: Literal["disabled"] = Field(description="Extended thinking off (the only setting served).")


def _no_output_format(config: Any) -> Any:
    if isinstance(config, dict) and config.get("format") is not None:
        raise ValueError("structured outputs (`output_config.format`) are not served yet; leave `format` out")
    return config


class OutputConfig(Body):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = Field(
        None, description="Accepted and ignored: a policy has one way of answering."
    )


# The rules between fields that the validators check, in the request schema too (see ``serve.bodies.CHAT_RULES``).
MESSAGES_RULES = [
    {  # the conversation holds a user turn (a lone assistant turn would be a prefill of nothing)
        "properties": {"messages": {"contains": {"properties": {"role": {"const": "user"}}, "required": ["role"]}}}
    },
    {  # a call made compulsory (`any`, or one tool named) needs tools to call
        "if": {
            "properties": {
                "tool_choice": {
                    "type": "object",
                    "properties": {"type": {"enum": ["any", "tool"]}},
                    "required": ["type"],
                }
            },
            "required": ["tool_choice"],
        },
        "then": {"properties": {"tools": {"type": "array", "minItems": 1}}, "required": ["tools"]},
    },
]


class MessagesRequest(Body):
    """The Messages API fields this server honours."""

    model_config = ConfigDict(json_schema_extra={"allOf": MESSAGES_RULES})

    model: str = Field(description="Served model id (see GET /v1/models).")
    max_tokens: WholeNumber = Field(ge=1, description="Cap on generated tokens (at most the server's cap).")
    messages: list[MessageParam] = Field(
        min_length=1,
        description="The conversation, alternating user and assistant turns; a last assistant turn is continued.",
    )
    system: str | list[TextBlock] | None = Field(None, description="The system prompt: text or text blocks.")
    tools: Annotated[list[CustomTool] | None, BeforeValidator(_client_tools)] = Field(
        None,
        description="Tools the model may call, shown to it in the model's tool format (`model.tool_format`); a reply "
        "that calls them comes back with `tool_use` blocks and `stop_reason: tool_use`.",
    )
    tool_choice: ToolChoice | None = Field(None, description="How the reply uses the tools (default `auto`).")
    stop_sequences: list[Annotated[str, Field(min_length=1)]] | None = Field(
        None, description="Strings that end the reply before them (`stop_reason: stop_sequence`)."
    )
    temperature: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="Sampling temperature (default 1; 0 picks the likeliest token). Newer `anthropic` SDKs send it, "
        "`top_p`, `top_k` and `seed` with `extra_body`.",
    )
    top_p: float | None = Field(None, gt=0.0, le=1.0, description="Nucleus sampling mass (default 1).")
    top_k: OptionalWholeNumber = Field(None, ge=0, description="Sample from the k likeliest tokens only (0: all).")
    stream: bool | None = Field(None, description="Send Anthropic's server-sent events.")
    metadata: Metadata | None = Field(None, description="`user_id` may carry an episode token.")
    thinking: Annotated[ThinkingDisabled | None, BeforeValidator(_no_thinking)] = Field(
        None, description="Only `{'type': 'disabled'}` is served."
    )
    seed: OptionalWholeNumber = Field(
        None, description="Not in Anthropic's API (send it with `extra_body`): same seed, same request, same reply."
    )
    cache_control: CacheControl | None = Field(None, description=CACHE_CONTROL)
    service_tier: Literal["auto", "standard_only"] | None = Field(None, description="Accepted and ignored.")
    output_config: Annotated[OutputConfig | None, BeforeValidator(_no_output_format)] = Field(
        None, description="`effort` is accepted and ignored; `format` (structured outputs) is not served yet."
    )

    @field_validator("tools")
    @classmethod
    def _distinct_names(cls, tools: list[CustomTool] | None) -> list[CustomTool] | None:
        distinct_names([tool.name for tool in tools or ()], "tool")
        return tools

    @model_validator(mode="after")
    def _has_user_turn(self) -> MessagesRequest:
        if not any(isinstance(turn, UserTurn) for turn in self.messages):
            raise ValueError("messages: the conversation needs a user turn")
        return self

    def system_text(self) -> str | None:
        return joined(self.system)

    def episode_user(self) -> str | None:
        return self.metadata.user_id if self.metadata is not None else None


def joined(content: str | list[TextBlock] | None) -> str | None:
    """Text, or text blocks joined with newlines."""
    if content is None or isinstance(content, str):
        return content
    return "\n".join(block.text for block in content)


# ---------------------------------------------------------------------------------------------------- responses


class TextOut(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ToolUseOut(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str = Field(description="`toolu_<hex>`: the id a `tool_result` block names.")
    name: str
    input: dict[str, Any]


StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class MessagesUsage(BaseModel):
    input_tokens: int = Field(description="Prompt tokens.")
    output_tokens: int = Field(description="Sampled tokens.")


class MessageOut(BaseModel):
    """The reply: an Anthropic ``Message`` (with the weights version that sampled it, beside Anthropic's fields)."""

    id: str = Field(description="`msg_<hex>`.")
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[Annotated[TextOut | ToolUseOut, Field(discriminator="type")]]
    stop_reason: StopReason | None = Field(description="Why the reply ended (null in a stream's `message_start`).")
    stop_sequence: str | None = Field(None, description="The stop sequence that ended it, if one did.")
    usage: MessagesUsage
    weights_version: int = Field(description="The policy weights version that sampled this reply.")


class AnthropicErrorDetail(BaseModel):
    type: str = Field(description="`invalid_request_error`, `authentication_error`, `not_found_error`, ...")
    message: str = Field(description="What was wrong and how to fix it.")


class AnthropicError(BaseModel):
    type: Literal["error"] = "error"
    error: AnthropicErrorDetail

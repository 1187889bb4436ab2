"""Request and response bodies of the HTTP API (OpenAI chat-completions format, plus /v1/act)."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from agentgym_rl.actors.engines.sampling import MAX_TOP_LOGPROBS
from agentgym_rl.envs.tools import NAME_PATTERN, Function, ToolCall

MAX_STOP_STRINGS = 4  # OpenAI's limit on `stop`


def _integral(value: Any) -> Any:
    # JSON Schema's integer is any number without a fraction: 15.0 is 15 (what a schema-driven client may send).
    return int(value) if isinstance(value, float) and value.is_integer() else value


# An integer field of a request body: a JSON integer, or a number without a fraction; never a boolean or a string.
# (The optional one wraps the union: bounds on a union of the annotated int leak into the schema as `ge`.)
WholeNumber = Annotated[int, BeforeValidator(_integral)]
OptionalWholeNumber = Annotated[int | None, BeforeValidator(_integral)]
# A token id: a whole number from 0 (the bound before the validator: after it, it leaks into the schema as `ge`).
TokenId = Annotated[int, Field(ge=0), BeforeValidator(_integral)]


class Body(BaseModel):
    """Base of every request body: an unknown field is a 400 that names it (OpenAI does the same), and so is a
    value of the wrong JSON type: strict validation reads no boolean or string as a number (`"seed": "7"`,
    `"max_tokens": true`) and no string or number as a boolean; a JSON integer is still a valid float, and a
    number without a fraction (`2.0`) a valid integer, as JSON Schema reads them."""

    model_config = ConfigDict(extra="forbid", strict=True)


class ChatMessage(Body):
    role: Literal["system", "user", "assistant"] = Field(description="Who wrote the message.")
    content: str = Field(description="Message text.")
    name: str | None = Field(None, description="Accepted for OpenAI compatibility; not shown to the model.")


class HistoryMessage(ChatMessage):
    role: Literal["user", "assistant"] = Field(description="Who wrote the message (the system prompt is the env's).")


class TextPart(Body):
    type: Literal["text"] = Field(description="Only text parts are served.")
    text: str = Field(description="The part's text.")


def _text_parts_only(content: Any) -> Any:
    # Before the union is tried, so that an image or audio part gets one clear message, not a union's errors.
    for index, part in enumerate(content if isinstance(content, list) else ()):
        if isinstance(part, dict) and part.get("type") != "text":
            raise ValueError(
                f'only text content parts are served (`{{"type": "text", "text": ...}}`); part {index} has '
                f"type {part.get('type')!r}"
            )
    return content


# A message's content: a string, or a list of text parts (joined with newlines), as OpenAI's clients send it.
Content = Annotated[str | list[TextPart], BeforeValidator(_text_parts_only)]
CONTENT = 'Message text, or a list of text parts (`[{"type": "text", "text": ...}]`, joined with newlines).'


def content_text(content: str | list[TextPart] | None) -> str | None:
    """A message's content as one text (parts joined with newlines)."""
    if content is None or isinstance(content, str):
        return content
    return "\n".join(part.text for part in content)


class SystemMessage(Body):
    role: Literal["system", "developer"] = Field(
        description="The system prompt (the functions offered are shown after it); `developer`, OpenAI's name for "
        "it with its newer models, is read as `system`."
    )
    content: Content = Field(description=CONTENT)
    name: str | None = Field(None, description="Accepted for OpenAI compatibility; not shown to the model.")


class UserMessage(Body):
    role: Literal["user"] = Field(description="A user turn.")
    content: Content = Field(description=CONTENT)
    name: str | None = Field(None, description="Accepted for OpenAI compatibility; not shown to the model.")


def json_object_text(arguments: str) -> str:
    """``arguments`` when it is a JSON object encoded as a string, as a call's arguments are sent (else a
    validation error saying so)."""
    try:
        parsed = json.loads(arguments)
    except ValueError as exc:
        raise ValueError(f"a call's arguments must be a JSON object encoded as a string; not JSON ({exc})") from None
    if isinstance(parsed, dict):
        return arguments
    raise ValueError(f"a call's arguments must be a JSON object encoded as a string, got {arguments!r:.100}")


ArgumentsText = Annotated[str, AfterValidator(json_object_text)]


class FunctionCallBody(Body):
    name: str = Field(description="The function called.")
    arguments: ArgumentsText = Field(
        description="The arguments: a JSON object, encoded as a string (as the endpoint sent it)."
    )


class ToolCallBody(Body):
    id: str = Field(description="The call's id, which the `tool` message answering it names in `tool_call_id`.")
    type: Literal["function"] = Field("function", description="Only function calls exist.")
    function: FunctionCallBody = Field(description="Which function, with which arguments.")

    def call(self) -> ToolCall:
        return ToolCall(id=self.id, name=self.function.name, arguments=json.loads(self.function.arguments))


class AssistantTurn(Body):
    """An earlier reply: text, calls, or both (``content`` may be null when it made calls)."""

    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"properties": {"content": {"not": {"type": "null"}}}, "required": ["content"]},
                {"properties": {"tool_calls": {"type": "array", "minItems": 1}}, "required": ["tool_calls"]},
            ]
        }
    )

    role: Literal["assistant"] = Field(description="An earlier reply of the model.")
    content: Content | None = Field(None, description=f"{CONTENT} Null (or absent) when the reply made calls.")
    tool_calls: list[ToolCallBody] | None = Field(None, description="The calls the reply made, as it returned them.")
    name: str | None = Field(None, description="Accepted for OpenAI compatibility; not shown to the model.")

    @model_validator(mode="after")
    def _says_something(self) -> AssistantTurn:
        if self.content is None and not self.tool_calls:
            raise ValueError("an assistant message needs `content` or `tool_calls`")
        return self


class ToolMessage(Body):
    role: Literal["tool"] = Field(description="The result of one call of the assistant message before it.")
    content: Content = Field(description=f"The call's result. {CONTENT}")
    tool_call_id: str = Field(description="The id of the call this answers (one of the previous reply's calls).")


RequestMessage = Annotated[SystemMessage | UserMessage | AssistantTurn | ToolMessage, Field(discriminator="role")]


class FunctionSpec(Body):
    name: str = Field(pattern=NAME_PATTERN, description="Function name (letters, digits, `_`, `-`; at most 64).")
    description: str | None = Field(None, description="What the function does, for the model to read.")
    parameters: dict[str, Any] | None = Field(
        None,
        json_schema_extra={"required": ["type"], "properties": {"type": {"const": "object"}}},
        description="JSON Schema of the arguments: a valid schema of `type: object` (default: no arguments).",
    )
    strict: bool | None = Field(None, description="Accepted for OpenAI compatibility; arguments are not constrained.")

    @model_validator(mode="after")
    def _function(self) -> FunctionSpec:
        self.function()
        return self

    def function(self) -> Function:
        """The function this declares (``ValueError`` when its parameters are no object schema)."""
        declared = {"name": self.name, "description": self.description or ""}
        if self.parameters is not None:
            declared["parameters"] = self.parameters
        try:
            return Function(**declared)
        except ValidationError as exc:
            raise ValueError(
                f"function {self.name!r}: {exc.errors()[0]['msg'].removeprefix('Value error, ')}"
            ) from None


class ToolSpec(Body):
    type: Literal["function"] = Field(description="Only function tools are served.")
    function: FunctionSpec = Field(description="The function offered.")


class FunctionName(Body):
    name: str = Field(description="A function among `tools`.")


class NamedToolChoice(Body):
    type: Literal["function"] = Field(description="Call a function.")
    function: FunctionName = Field(description="The function the reply must call.")


# What `stop` accepts (the validator below says so in its error, naming `stop`).
STOP_SCHEMA = {
    "anyOf": [
        {"type": "string", "minLength": 1},
        {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": MAX_STOP_STRINGS},
        {"type": "null"},
    ]
}


def distinct_names(names: list[str], noun: str) -> None:
    """``ValueError`` when two of a request's tools share a name: a call names its function, so two of one name
    would make a reply's calls ambiguous (``noun`` says what the API calls a tool)."""
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"each {noun} needs its own name; repeated: {', '.join(repeated)}")


def stop_strings(stop: str | list[str] | None) -> list[str] | None:
    """OpenAI's ``stop`` as a list (``ValueError`` for more than four or an empty one)."""
    stops = [stop] if isinstance(stop, str) else stop
    if stops is None:
        return None
    if len(stops) > MAX_STOP_STRINGS or any(not s for s in stops):
        raise ValueError(f"give at most {MAX_STOP_STRINGS} non-empty stop strings, got {stops!r}")
    return stops


# The rules between fields that the validators below check, in the request schema as well (JSON Schema's
# if/then), so that a client generated from it, or a fuzzer, knows them.
CHAT_RULES = [
    {  # max_tokens and max_completion_tokens: one of them
        "if": {"properties": {"max_tokens": {"type": "integer"}}, "required": ["max_tokens"]},
        "then": {"properties": {"max_completion_tokens": {"type": "null"}}},
    },
    {  # top_logprobs needs logprobs
        "if": {"properties": {"top_logprobs": {"type": "integer", "minimum": 1}}, "required": ["top_logprobs"]},
        "then": {"properties": {"logprobs": {"const": True}}, "required": ["logprobs"]},
    },
    {  # a call of an episode (`user: "episode:<token>"`) samples one reply
        "if": {"properties": {"user": {"type": "string", "pattern": "^episode:"}}, "required": ["user"]},
        "then": {"properties": {"n": {"enum": [1, None]}}},
    },
    {  # stream_options needs stream
        "if": {"properties": {"stream_options": {"type": "object"}}, "required": ["stream_options"]},
        "then": {"properties": {"stream": {"const": True}}, "required": ["stream"]},
    },
    {  # a call made compulsory (`required`, or one function named) needs tools to call
        "if": {
            "properties": {"tool_choice": {"anyOf": [{"const": "required"}, {"type": "object"}]}},
            "required": ["tool_choice"],
        },
        "then": {"properties": {"tools": {"type": "array", "minItems": 1}}, "required": ["tools"]},
    },
]


class StreamOptions(Body):
    include_usage: bool | None = Field(None, description="Send a final chunk with token usage before `[DONE]`.")


class ChatCompletionRequest(Body):
    """The chat-completions fields this server honours; ``null`` means the default, as in OpenAI's API."""

    model_config = ConfigDict(json_schema_extra={"allOf": CHAT_RULES})

    model: str = Field(description="Served model id (see GET /v1/models).")
    messages: list[RequestMessage] = Field(
        min_length=1,
        description="The conversation so far: system, user, assistant (with the `tool_calls` the endpoint returned) "
        "and `tool` messages, each run of `tool` messages answering the calls of the assistant message before it.",
    )
    tools: list[ToolSpec] | None = Field(
        None,
        description="Functions the model may call, shown to it in the model's tool format (`model.tool_format`); a "
        "reply that calls them comes back as `message.tool_calls` with `finish_reason: tool_calls`.",
    )
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = Field(
        None,
        description="`auto` (the default with tools): the model calls functions or writes text; `none`: the functions "
        "are still shown (the prompt stays the same) but the reply is returned as text, never read as calls; "
        "`required`: the reply starts with a call (the format's call opening is put at its start); "
        '`{"type": "function", "function": {"name": ...}}`: the reply calls that function (the opening and the '
        "function's name are put at its start).",
    )
    parallel_tool_calls: bool | None = Field(
        None, description="Whether a reply may make several calls (default true); false returns its first call only."
    )
    max_tokens: OptionalWholeNumber = Field(
        None, ge=1, description="Cap on generated tokens (default: the server cap)."
    )
    max_completion_tokens: OptionalWholeNumber = Field(None, ge=1, description="Newer name of `max_tokens` (give one).")
    temperature: float | None = Field(
        None,
        ge=0.0,
        le=2.0,
        description="Sampling temperature (default 1); 0, or anything below 1e-5, picks the likeliest token.",
    )
    top_p: float | None = Field(
        None, gt=0.0, le=1.0, description="Nucleus sampling mass (default 1); below 1e-5 picks the likeliest token."
    )
    n: OptionalWholeNumber = Field(None, ge=1, description="Completions per request (default 1; at most serve.max_n).")
    stop: Annotated[str | list[str] | None, WithJsonSchema(STOP_SCHEMA)] = Field(
        None, description="Up to 4 strings; the text ends before the first one sampled (it is not returned)."
    )
    seed: OptionalWholeNumber = Field(
        None, description="Same seed, same request: the same completion, whatever else runs."
    )
    logprobs: bool | None = Field(None, description="Return the log-probability of every sampled token.")
    top_logprobs: OptionalWholeNumber = Field(
        None, ge=0, le=MAX_TOP_LOGPROBS, description="Also the likeliest alternatives per token (needs logprobs)."
    )
    presence_penalty: float | None = Field(
        None, ge=-2.0, le=2.0, description="Subtracted from the logit of every token already in the reply."
    )
    frequency_penalty: float | None = Field(
        None, ge=-2.0, le=2.0, description="Subtracted from a token's logit once per occurrence in the reply."
    )
    stream: bool | None = Field(None, description="Send server-sent events (`data: {...}` chunks, then `[DONE]`).")
    stream_options: StreamOptions | None = Field(None, description="Streaming options.")
    user: str | None = Field(
        None,
        description="`episode:<token>` tags the call with an episode opened by `POST /v1/episodes` (as the "
        "`X-Episode-Token` header does); anything else is accepted for OpenAI compatibility and ignored.",
    )

    @field_validator("tools")
    @classmethod
    def _distinct_names(cls, tools: list[ToolSpec] | None) -> list[ToolSpec] | None:
        distinct_names([tool.function.name for tool in tools or ()], "function in `tools`")
        return tools

    @field_validator("stop")
    @classmethod
    def _stops(cls, stop: str | list[str] | None) -> list[str] | None:
        return stop_strings(stop)

    @model_validator(mode="after")
    def _consistent(self) -> ChatCompletionRequest:
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            raise ValueError("give max_completion_tokens or max_tokens (its older name), not both")
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs=true")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed with stream=true")
        return self

    @property
    def requested_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def token_field(self) -> str:
        """The field ``requested_tokens`` came from (errors name it)."""
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob]


class FunctionCallOut(BaseModel):
    name: str = Field(description="The function called.")
    arguments: str = Field(description="The arguments as a JSON object encoded as a string.")


class ToolCallOut(BaseModel):
    id: str = Field(description="`call_<hex>`: the id a `tool` message answering the call names.")
    type: Literal["function"] = "function"
    function: FunctionCallOut

    @classmethod
    def of(cls, call: ToolCall) -> ToolCallOut:
        return cls(id=call.id, function=FunctionCallOut(name=call.name, arguments=call.arguments_json()))


# Why a choice ended: its stop token or a stop string, the token cap, or the calls it made.
FinishReason = Literal["stop", "length", "tool_calls"]


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = Field(description="The reply's text; with calls, the text outside them (null if none).")
    tool_calls: list[ToolCallOut] | None = Field(None, description="The calls the reply made (null: it made none).")


class Choice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: FinishReason
    logprobs: ChoiceLogprobs | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    system_fingerprint: str = Field(description="`weights-v<N>`: the weights version that served the completion.")
    weights_version: int = Field(description="The weights version that produced every token of every choice.")
    choices: list[Choice]
    usage: Usage


class FunctionCallDelta(BaseModel):
    name: str | None = Field(None, description="The function's name, in the call's first delta.")
    arguments: str | None = Field(None, description="The next piece of the arguments' JSON string.")


class ToolCallDelta(BaseModel):
    index: int = Field(description="Which call of the reply (0, 1, ...) this piece belongs to.")
    id: str | None = Field(None, description="The call's id, in its first delta.")
    type: Literal["function"] | None = None
    function: FunctionCallDelta


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(BaseModel):
    index: int
    delta: Delta
    finish_reason: FinishReason | None = None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    system_fingerprint: str
    weights_version: int
    choices: list[ChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "agentgym-rl"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ActRequest(Body):
    """One agent decision: the env's instruction is the system prompt, ``observation`` the newest user turn."""

    env: str = Field(description="Registered environment name (its instruction and action parser are used).")
    observation: str = Field(description="The current observation, sent as the last user message.")
    history: list[HistoryMessage] = Field(
        default_factory=list,
        description="Earlier user/assistant turns of the episode, oldest first (no system message: the env's "
        "instruction is the system prompt).",
    )
    max_tokens: OptionalWholeNumber = Field(
        None, ge=1, description="Cap on generated tokens (default: the server cap)."
    )
    temperature: float = Field(
        1.0, ge=0.0, le=2.0, description="Sampling temperature; 0, or anything below 1e-5, picks the likeliest token."
    )
    seed: OptionalWholeNumber = Field(None, description="Same seed, same request: the same completion.")


class ActResponse(BaseModel):
    action: str | None = Field(description="The parsed action, or None when the completion holds no valid action.")
    invalid_reason: str | None = Field(description="Why no action could be parsed (None when `action` is set).")
    completion: str = Field(description="The raw completion text.")
    finish_reason: Literal["stop", "length"]
    weights_version: int = Field(description="Weights version that produced the completion.")


class ReplicaCache(BaseModel):
    prefill_tokens: int = Field(0, description="Prompt ids the replica ran through the model.")
    reused_tokens: int = Field(
        0, description="Prompt ids it took from its prefix cache instead (`serve.prefix_cache_tokens`)."
    )
    requests: int = Field(description="Generations it served.")
    prefix_hit_rate: float = Field(
        description="reused / (reused + prefilled) prompt ids: the share of its prompts served from cache (0 before "
        "any)."
    )

    @classmethod
    def of(cls, counters: dict[str, int]) -> ReplicaCache:
        """From a replica's reported counters (an engine without a prefix cache reports none)."""
        prefilled, reused = counters.get("prefill_tokens", 0), counters.get("reused_tokens", 0)
        total = prefilled + reused
        return cls(
            prefill_tokens=prefilled,
            reused_tokens=reused,
            requests=counters["requests"],
            prefix_hit_rate=reused / total if total else 0.0,
        )


class PolicyInfo(BaseModel):
    model: str = Field(description="Served model id.")
    replica: str = Field(description="Id of the model replica that answered.")
    source: str = Field(description="Checkpoint directory or model name the server started from.")
    engine: str = Field(description="The replica's engine (`transformers` or `vllm`).")
    weights_version: int = Field(description="Version of the weights now loaded (0 = the source's own weights).")
    iteration: int | None = Field(description="Training iteration that produced them (None before any update).")
    updates: int = Field(description="Weight updates applied since start.")
    torch_threads: int = Field(description="Torch threads the replica computes with (`serve.torch_threads`).")
    stats: dict[str, int] = Field(
        description="The replica's engine counters: `in_flight` and `waiting` requests, `swap_pending` (1 while a "
        "weight swap waits for the requests in flight), `generated_tokens`, `finished` choices, `abandoned` "
        "requests (their client went away) and, for transformers, `steps`, `decoding_rows`, `kv_positions`, "
        "`prefill_tokens`; and the replica's routes' `tool_calls` (calls returned) and `unparsed_tool_calls` "
        "(replies that opened a call that did not parse, returned as text)."
    )
    replicas: dict[str, ReplicaCache] = Field(
        description="Every replica's prefix-cache counters, by replica id, as each last reported them (after each "
        "request it served)."
    )


class Health(BaseModel):
    status: Literal["ok"] = "ok"
    weights_version: int


class ErrorDetail(BaseModel):
    message: str = Field(description="What went wrong and what to change.")
    type: str = Field(description="OpenAI's error type, e.g. `invalid_request_error`, `rate_limit_error`.")
    param: str | None = Field(description="The request field at fault, when one is.")
    code: str | None = Field(description="A machine-readable code, e.g. `model_not_found`, `invalid_json`.")


class ErrorResponse(BaseModel):
    """Every error answer of the endpoint, in OpenAI's shape (the `openai` client raises from it)."""

    error: ErrorDetail


class EpisodeOpenRequest(Body):
    """Open an episode: the chat calls tagged with its token are recorded token by token."""

    env: str = Field("endpoint", description="Which environment the agent plays (a label kept on the trajectory).")
    task_id: WholeNumber = Field(0, description="The task the agent plays (kept on the trajectory).")
    group: str | None = Field(
        None,
        description="Episodes sharing a group key are compared with each other by group algorithms (GRPO, RLOO): "
        "give the episodes of one task the same key. None: a group of its own.",
    )


class SegmentInfo(BaseModel):
    began_at_turn: int = Field(description="The episode's turns recorded before this segment began.")
    turns: int = Field(description="Replies recorded in it.")
    tokens: int = Field(description="Token ids recorded in it (its opening, continuations and replies).")
    reason: str | None = Field(
        description="How the call that began it rewrote the history (None for the episode's first segment)."
    )


class EpisodeInfo(BaseModel):
    id: str = Field(description="The episode id.")
    env: str
    task_id: int
    group: str
    status: Literal["open", "closed"] = Field(description="`closed` once its reward is posted.")
    turns: int = Field(description="Replies recorded so far.")
    tokens: int = Field(description="Token ids recorded so far (prompts, continuations and replies).")
    sampled_tokens: int = Field(description="Of those, the ids the policy sampled (what trains).")
    weights_versions: list[int] = Field(description="The policy versions that sampled its replies.")
    segments: list[SegmentInfo] = Field(
        description="Its recorded segments, in order: one, and one more each time the client's history did not "
        "continue the recorded one (`serve.episodes.on_rewrite: segment`); each trains as a trajectory."
    )
    mismatch: str | None = Field(
        description="Where the client's history stopped matching what was sampled (`serve.episodes.on_rewrite: "
        "mismatch`); such an episode never trains."
    )
    truncated: bool = Field(description="A call was refused for going over the context budget.")
    reward: float | None = Field(description="The posted reward (summed over turns); None while open.")
    trainable: bool = Field(description="Closed, with turns, without a mismatch: the trainer will use it.")


class EpisodeOpened(EpisodeInfo):
    token: str = Field(
        description='`<id>.<secret>`: send it as the `X-Episode-Token` header (or `user: "episode:<token>"`) '
        "with every chat call of the episode and with its reward."
    )
    ttl_s: float = Field(description="Seconds without a call or reward after which the episode is dropped.")


class EpisodeReward(Body):
    """Close an episode with one outcome reward (given to its last turn) or one reward per turn."""

    model_config = ConfigDict(
        json_schema_extra={
            "oneOf": [
                {"properties": {"reward": {"type": "number"}}, "required": ["reward"]},
                {"properties": {"rewards": {"type": "array"}}, "required": ["rewards"]},
            ]
        },
    )

    reward: float | None = Field(None, description="The outcome reward.")
    rewards: list[float] | None = Field(None, description="One reward per recorded turn, in order.")

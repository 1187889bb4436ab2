"""Request and response bodies of the HTTP API (OpenAI chat-completions format, plus /v1/act)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Body(BaseModel):
    """Base of every request body: unknown fields are a 422 that names them."""

    model_config = ConfigDict(extra="forbid")


class ChatMessage(Body):
    role: Literal["system", "user", "assistant"] = Field(description="Who wrote the message.")
    content: str = Field(description="Message text.")
    name: str | None = Field(None, description="Accepted for OpenAI compatibility; not shown to the model.")


class StreamOptions(Body):
    include_usage: bool = Field(False, description="Send a final chunk with token usage before `[DONE]`.")


class ChatCompletionRequest(Body):
    """The subset of OpenAI's chat-completions request that this server honours."""

    model: str = Field(description="Served model id (see GET /v1/models).")
    messages: list[ChatMessage] = Field(min_length=1, description="The conversation so far.")
    max_tokens: int | None = Field(None, ge=1, description="Cap on generated tokens (default: the server cap).")
    max_completion_tokens: int | None = Field(None, ge=1, description="Newer name of `max_tokens`.")
    temperature: float = Field(1.0, ge=0.0, le=2.0, description="Sampling temperature; 0 picks the likeliest token.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    n: int = Field(1, ge=1, le=1, description="Completions per request; only 1 is supported.")
    stream: bool = Field(False, description="Send server-sent events (`data: {...}` chunks, then `data: [DONE]`).")
    stream_options: StreamOptions | None = Field(None, description="Streaming options.")
    user: str | None = Field(None, description="Accepted for OpenAI compatibility; ignored.")

    @model_validator(mode="after")
    def _one_token_cap(self) -> ChatCompletionRequest:
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            if self.max_tokens != self.max_completion_tokens:
                raise ValueError("give max_tokens or max_completion_tokens, not two different values")
        return self

    @property
    def requested_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class Choice(BaseModel):
    index: int
    message: AssistantMessage
    finish_reason: Literal["stop", "length"]


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChunkChoice(BaseModel):
    index: int
    delta: Delta
    finish_reason: Literal["stop", "length"] | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
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
    history: list[ChatMessage] = Field(
        default_factory=list,
        description="Earlier user/assistant turns of the episode, oldest first (no system message: the env's "
        "instruction is the system prompt).",
    )
    max_tokens: int | None = Field(None, ge=1, description="Cap on generated tokens (default: the server cap).")
    temperature: float = Field(1.0, ge=0.0, le=2.0, description="Sampling temperature; 0 picks the likeliest token.")

    @model_validator(mode="after")
    def _no_system_in_history(self) -> ActRequest:
        if any(m.role == "system" for m in self.history):
            raise ValueError("history must not contain a system message: the env's instruction is the system prompt")
        return self


class ActResponse(BaseModel):
    action: str | None = Field(description="The parsed action, or None when the completion holds no valid action.")
    invalid_reason: str | None = Field(description="Why no action could be parsed (None when `action` is set).")
    completion: str = Field(description="The raw completion text.")
    finish_reason: Literal["stop", "length"]
    weights_version: int = Field(description="Weights version that produced the completion.")


class PolicyInfo(BaseModel):
    model: str = Field(description="Served model id.")
    replica: str = Field(description="Id of the model replica that answered.")
    source: str = Field(description="Checkpoint directory or model name the server started from.")
    weights_version: int = Field(description="Version of the weights now loaded (0 = the source's own weights).")
    iteration: int | None = Field(description="Training iteration that produced them (None before any update).")
    updates: int = Field(description="Weight updates applied since start.")
    batches: int = Field(description="Generation batches this replica has run.")
    requests: int = Field(description="Requests those batches served (requests / batches = mean batch size).")
    generate_s: float = Field(description="Seconds this replica has spent inside the engine's generate.")


class Health(BaseModel):
    status: Literal["ok"] = "ok"
    weights_version: int

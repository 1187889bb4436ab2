"""Request bodies and server options of the AgentGym-compatible env server.

The bodies are as tolerant as AgentGym's own FastAPI models: ids and task indices may arrive as
JSON strings of digits (``"id": "0"``), and fields a body does not define are ignored. Values that
cannot be read as what they name (``"data_idx": "one"``, ``1.5``, an action that is not text) are
still refused with 422; a body that is not UTF-8 JSON text, with 400.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    WithJsonSchema,
    field_validator,
)

Protocol = Literal["agentgym", "textcraft", "sciworld", "searchqa", "webarena"]
PROTOCOLS: tuple[str, ...] = get_args(Protocol)
# AgentGym's SciWorld server reports the simulator's own 0-100 score; this project's SciWorld env
# rewards score changes / 100.
SCIWORLD_SCALE = 100

# Which AgentGym server each of this project's envs mirrors; every other env speaks the common protocol.
_ENV_PROTOCOLS: dict[str, Protocol] = {
    "textcraft": "textcraft",
    "sciworld": "sciworld",
    "search": "searchqa",
    "web": "webarena",
}


def default_protocol(env_name: str | None) -> Protocol:
    """The protocol of the AgentGym server that mirrors env ``env_name``: ``textcraft``, ``sciworld``,
    ``searchqa`` (env ``search``), ``webarena`` (env ``web``), else ``agentgym`` (BabyAI's shape)."""
    return _ENV_PROTOCOLS.get(env_name or "", "agentgym")


class ServerOptions(BaseModel):
    """What one env server hosts and how much of it."""

    model_config = ConfigDict(extra="forbid")

    env_name: str = Field(description="Registered env every /create instantiates (see `agentgym-rl envs`).")
    env_options: dict[str, Any] = Field(default_factory=dict, description="Options passed to each env instance.")
    max_envs: int = Field(default=64, ge=1, description="Live env instances allowed at once; /create beyond is 429.")
    protocol: Protocol = Field(
        default="agentgym",
        description="Response shapes of which AgentGym server: 'agentgym' (BabyAI's, the common protocol), "
        "'textcraft', 'sciworld', 'searchqa' (Deep Search's `env_idx` variant) or 'webarena' (`env_idx`, "
        "`/reset {env_idx, seed, idx}`).",
    )
    max_action_chars: int = Field(
        default=100_000, ge=1, description="Longest action text /step accepts; longer actions are rejected with 413."
    )
    token: str | None = Field(
        default=None, description="When set, every request must carry `Authorization: Bearer <token>`."
    )


def _printable_unicode(text: str) -> str:
    # JSON may carry lone surrogates ("\udcff"): they are not encodable as UTF-8, so envs and the
    # response encoder would fail on them. They become U+FFFD like any other undecodable byte.
    return text.encode("utf-8", "replace").decode("utf-8")


class ErrorBody(BaseModel):
    """Every error answer of the env server."""

    error: str = Field(description="What went wrong, naming the field, id or limit.")


# The statuses every route of the env server may answer besides 200 (see ``envs.http.server``).
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": description}
    for status, description in {
        400: "a body that is not JSON text: not UTF-8 (RFC 8259), or JSON that does not parse",
        401: "missing or wrong bearer token (when the server has one)",
        404: "unknown or closed env id, or a task (id, goal) the env does not have",
        405: "the route does not take this method",
        409: "a step before the reset or after the episode ended",
        413: "an action over the server's length limit",
        422: "a malformed request: a missing or mistyped field",
        429: "the server holds its most live envs",
        500: "the env raised unexpectedly",
        503: "the env cannot start on this machine",
    }.items()
}


def _whole_number(value: Any) -> Any:
    """Ids and indices as AgentGym's servers read them: integers, or text of digits ("0" as 0); never a
    boolean or a fraction."""
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError("must be an integer")
    if isinstance(value, str) and not re.fullmatch(r"-?[0-9]+", value):
        raise ValueError("must be an integer or a string of digits")
    return value


# An id or index on the wire: what ``_whole_number`` accepts, and a JSON schema that says so.
WireInt = Annotated[
    int,
    BeforeValidator(_whole_number),
    WithJsonSchema({"anyOf": [{"type": "integer"}, {"type": "string", "pattern": "^-?[0-9]+$"}]}),
]


class _Request(BaseModel):
    # AgentGym's FastAPI models ignore fields they do not define and read "0" as 0.
    model_config = ConfigDict(extra="ignore")


class _Id(_Request):  # the common protocol and the TextCraft and SciWorld servers name the env `id`
    id: WireInt = Field(description="Env id returned by /create.")


class _EnvIdx(_Request):  # Deep Search's and WebArena's servers name it `env_idx`
    env_idx: WireInt = Field(description="Env index returned by /create.")


class _Action(_Request):
    action: StrictStr = Field(description="Action text: a bare action or a model reply holding one.")
    verbatim: StrictBool = Field(
        default=False,
        description="Hand the action to the env exactly as sent; by default a text with no action in the env's "
        "syntax is read as a bare action (what AgentGym's clients send). This project's client sets it whenever it "
        "sends a model's whole reply, so the env parses exactly what the model wrote.",
    )

    @field_validator("action")
    @classmethod
    def _clean(cls, action: str) -> str:
        return _printable_unicode(action)


class ResetRequest(_Id):
    """POST /reset: start task ``data_idx`` in env ``id``."""

    data_idx: WireInt = Field(description="Task id of the env (AgentGym's data index).")


class TextCraftResetRequest(_Id):
    """POST /reset (textcraft): start task ``data_idx`` (AgentGym's TextCraft server defaults it to 0)."""

    data_idx: WireInt = Field(default=0, description="Task id of the env (AgentGym's data index).")


class TextCraftCreateRequest(_Request):
    """POST /create (textcraft): optionally a goal and crafting-command listing of the caller's."""

    commands: StrictStr | None = Field(default=None, description="Crafting commands listed to the model.")
    goal: StrictStr | None = Field(default=None, description="Goal item, e.g. 'minecraft:oak_planks'.")


class StepRequest(_Id, _Action):
    """POST /step: apply ``action`` in env ``id``."""


class CloseRequest(_Id):
    """POST /close: free env ``id``."""


class SearchCreateRequest(_Request):
    """POST /create (searchqa): optionally reset the new env to question ``id`` at once."""

    id: WireInt | None = Field(default=None, description="Question (task id) to start; None: reset later.")


class SearchResetRequest(_EnvIdx):
    """POST /reset (searchqa): start question ``id`` in env ``env_idx``."""

    id: WireInt = Field(description="Question index (task id).")


class EnvIdxStepRequest(_EnvIdx, _Action):
    """POST /step (searchqa, webarena): apply ``action`` in env ``env_idx``."""


class EnvIdxCloseRequest(_EnvIdx):
    """POST /close (searchqa, webarena): free env ``env_idx``."""


class WebArenaResetRequest(_EnvIdx):
    """POST /reset (webarena): start task ``idx`` (WebArena's config index) in env ``env_idx``."""

    idx: WireInt = Field(description="Task id (WebArena's config file index).")
    seed: WireInt | None = Field(
        default=None, description="Accepted as AgentGym's client sends it (0); tasks are seeded."
    )

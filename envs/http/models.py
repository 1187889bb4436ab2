"""Request bodies and server options of the AgentGym-compatible env server."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, field_validator


def default_protocol(env_name: str | None) -> Literal["agentgym", "searchqa"]:
    """``searchqa`` for env ``search`` (as AgentGym's SearchQA server speaks), else ``agentgym``."""
    return "searchqa" if env_name == "search" else "agentgym"


class ServerOptions(BaseModel):
    """What one env server hosts and how much of it."""

    model_config = ConfigDict(extra="forbid")

    env_name: str = Field(description="Registered env every /create instantiates (see `agentgym-rl envs`).")
    env_options: dict[str, Any] = Field(default_factory=dict, description="Options passed to each env instance.")
    max_envs: int = Field(default=64, ge=1, description="Live env instances allowed at once; /create beyond is 429.")
    protocol: Literal["agentgym", "searchqa"] = Field(
        default="agentgym",
        description="'agentgym': the common protocol (BabyAI, SciWorld, TextCraft servers); 'searchqa': Deep "
        "Search's variant (`env_idx` bodies, bare-int /create, string /reset).",
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


class _Body(BaseModel):  # AgentGym's common protocol names the env `id`
    model_config = ConfigDict(extra="forbid")

    id: StrictInt = Field(description="Env id returned by /create.")


class ResetRequest(_Body):
    """POST /reset: start task ``data_idx`` in env ``id``."""

    data_idx: StrictInt = Field(description="Task id of the env (AgentGym's data index).")


class _Action(BaseModel):
    model_config = ConfigDict(extra="forbid")

    action: StrictStr = Field(description="Action text: a bare action or a model reply holding one.")
    verbatim: bool = Field(
        default=False,
        description="Hand the action to the env exactly as sent; by default a text with no action in the env's "
        "syntax is read as a bare action (what AgentGym's clients send). This project's client sets it whenever it "
        "sends a model's whole reply, so the env parses exactly what the model wrote.",
    )

    @field_validator("action")
    @classmethod
    def _clean(cls, action: str) -> str:
        return _printable_unicode(action)


class StepRequest(_Body, _Action):
    """POST /step: apply ``action`` in env ``id``."""


class CloseRequest(_Body):
    """POST /close: free env ``id``."""


class _SearchBody(BaseModel):  # Deep Search's variant names the env `env_idx`
    model_config = ConfigDict(extra="forbid")

    env_idx: StrictInt = Field(description="Env index returned by /create.")


class SearchCreateRequest(BaseModel):
    """POST /create (searchqa): optionally reset the new env to question ``id`` at once."""

    model_config = ConfigDict(extra="forbid")

    id: StrictInt | None = Field(default=None, description="Question (task id) to start; None: reset later.")


class SearchResetRequest(_SearchBody):
    """POST /reset (searchqa): start question ``id`` in env ``env_idx``."""

    id: StrictInt = Field(description="Question index (task id).")


class SearchStepRequest(_SearchBody, _Action):
    """POST /step (searchqa): apply ``action`` in env ``env_idx``."""


class SearchCloseRequest(_SearchBody):
    """POST /close (searchqa): free env ``env_idx``."""

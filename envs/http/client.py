"""``AgentGymClient``: a ``TextEnv`` that plays a remote AgentGym-style env server over HTTP.

Registered as env ``agentgym-remote``, so an ``EnvActor`` (or a config's ``env.name``) can use any
AgentGym server: this project's ``agentgym-rl env-server`` or AgentGym's own servers, including envs
this project does not implement. When ``env_name`` names one of our envs, its instruction, action
parser and task splits are reused and the model's whole reply is sent, so the remote env parses
exactly what the in-process env would; otherwise the ``instruction`` and ``splits`` options are
used and the action is read from an ``Action:`` line and sent bare, as AgentGym's clients do.
Server errors (4xx/5xx with ``{"error": ...}``) and unreachable servers raise ``RemoteEnvError``.

Example (config)::

    env: {name: agentgym-remote, options: {base_url: "http://127.0.0.1:36001", env_name: babyai}}
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
from collections.abc import Sequence
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field

from envs.base import EnvError, InvalidAction, Observation, StepResult, TextEnv
from envs.http.models import default_protocol
from envs.registry import make

_ACTION = re.compile(r"action\s*:", re.IGNORECASE)
GENERIC_INSTRUCTION = (
    "You are an agent acting in a text environment. Each turn, think briefly, then end your reply with "
    "one line 'Action: <action>'."
)
NO_ACTION = "No action found. End your reply with a line 'Action: <action>'."


class RemoteEnvError(EnvError):
    """The server refused a request (its JSON error message is quoted) or could not be reached."""


def generic_parse_action(model_text: str) -> str | InvalidAction:
    """The first non-empty line after the last ``Action:`` marker, stripped; InvalidAction if none."""
    matches = list(_ACTION.finditer(model_text))
    if not matches:
        return InvalidAction(reason=NO_ACTION)
    lines = (line.strip() for line in model_text[matches[-1].end() :].splitlines())
    action = next((line for line in lines if line), "")
    return action or InvalidAction(reason=NO_ACTION)


class AgentGymClient(TextEnv):
    """One env instance on a remote AgentGym-style server (``/create``, ``/reset``, ``/step``, ``/close``)."""

    name = "agentgym-remote"

    class Options(BaseModel):
        """Options of the remote env client."""

        model_config = ConfigDict(extra="forbid")

        base_url: str = Field(description="Server address, e.g. http://127.0.0.1:36001.")
        env_name: str | None = Field(
            default=None,
            description="One of this project's env names when the server runs it: its instruction, parser and "
            "splits are reused. None for envs this project does not implement.",
        )
        env_options: dict[str, Any] = Field(
            default_factory=dict, description="Options of the local `env_name` env (for instruction/splits only)."
        )
        instruction: str = Field(default=GENERIC_INSTRUCTION, description="System prompt when `env_name` is None.")
        splits: dict[str, list[int]] = Field(
            default_factory=dict,
            description="Task ids per split, e.g. {'test': [0, 1, 2]}; overrides the splits of `env_name`.",
        )
        action_format: Literal["reply", "parsed"] | None = Field(
            default=None,
            description="What /step sends: 'reply' the model's whole reply (this project's server, and servers "
            "that parse replies such as AgentGym's SearchQA), 'parsed' the action parsed from it (AgentGym's "
            "'Action:' servers: BabyAI, TextCraft, SciWorld; an unparsable reply is still sent whole). "
            "None: 'reply' when `env_name` is set, else 'parsed'.",
        )
        protocol: Literal["agentgym", "searchqa"] | None = Field(
            default=None,
            description="Wire protocol: 'agentgym' (`id` bodies) or 'searchqa' (Deep Search's `env_idx` bodies). "
            "None: 'searchqa' when `env_name` is 'search', else 'agentgym'.",
        )
        timeout: float = Field(default=60.0, gt=0, description="Seconds to wait for one HTTP request.")
        token: str | None = Field(default=None, description="Bearer token, when the server requires one.")

    def __init__(self, **options: Any) -> None:
        self.options = self.Options(**options)
        headers = {"Authorization": f"Bearer {self.options.token}"} if self.options.token else {}
        self._http = httpx.Client(base_url=self.options.base_url, timeout=self.options.timeout, headers=headers)
        self._id: int | None = None
        self._searchqa = (self.options.protocol or default_protocol(self.options.env_name)) == "searchqa"

    @functools.cached_property
    def _local(self) -> TextEnv | None:
        # Created on first use only: the local env is never stepped, it lends its prompt, parser and splits.
        return make(self.options.env_name, self.options.env_options) if self.options.env_name else None

    @property
    def instruction(self) -> str:
        """The local env's instruction when ``env_name`` is set, else the ``instruction`` option."""
        return self._local.instruction if self._local is not None else self.options.instruction

    def tasks(self, split: str) -> Sequence[int]:
        """Task ids of ``split`` from the ``splits`` option, else from the local env."""
        if split in self.options.splits:
            return list(self.options.splits[split])
        if self._local is not None:
            return self._local.tasks(split)
        raise EnvError(
            f"unknown split {split!r} for the remote env; known splits: {', '.join(self.options.splits) or 'none'} "
            "(set the `splits` option, or `env_name` when the server runs one of this project's envs)"
        )

    def parse_action(self, model_text: str) -> str | InvalidAction:
        """The local env's parser when ``env_name`` is set, else the text after the last ``Action:``."""
        if self._local is not None:
            return self._local.parse_action(model_text)
        return generic_parse_action(model_text)

    def reset(self, task_id: int) -> Observation:
        """Create the remote env on first use, then reset it to ``task_id`` (AgentGym's ``data_idx``)."""
        if self._id is None:
            created = self._post("/create", None)
            self._id = int(created if self._searchqa else created["id"])
        if self._searchqa:
            return Observation(text=_text(self._post("/reset", {"env_idx": self._id, "id": task_id})))
        body = self._post("/reset", {"id": self._id, "data_idx": task_id})
        return Observation(text=_text(body["observation"]), info=dict(body.get("info") or {}))

    def step(self, action_text: str) -> StepResult:
        """Send the reply, or the action parsed from it, per the ``action_format`` option."""
        if self._id is None:
            raise EnvError("no episode has started; call reset first")
        send_reply = self.options.action_format == "reply" or (
            self.options.action_format is None and self.options.env_name is not None
        )
        action = None if send_reply else self.parse_action(action_text)
        key = "env_idx" if self._searchqa else "id"
        if isinstance(action, str):
            request = {key: self._id, "action": action}
        else:
            # `verbatim` stops this project's server from reading the reply as a bare action, so its env
            # parses exactly what the model wrote (AgentGym's servers ignore the extra field).
            request = {key: self._id, "action": action_text, "verbatim": True}
        body = self._post("/step", request)
        info = dict(body.get("info") or {})
        if "score" in body:
            info.setdefault("score", body["score"])
        return StepResult(
            observation=_text(body["observation"]), reward=float(body["reward"]), done=bool(body["done"]), info=info
        )

    def close(self) -> None:
        """Free the remote env (best effort: the server may already be gone) and the HTTP connection."""
        # A server that is gone has freed the env already.
        with contextlib.suppress(RemoteEnvError):
            if self._id is not None:
                self._post("/close", {"env_idx" if self._searchqa else "id": self._id})
        self._id = None
        self._http.close()
        if self.__dict__.get("_local") is not None:  # only when the cached local env was ever made
            self._local.close()

    def _post(self, path: str, body: dict[str, Any] | None) -> Any:
        try:
            # ASCII JSON: model text may hold lone surrogates, which UTF-8 cannot encode.
            content = json.dumps(body) if body is not None else None
            response = self._http.post(path, content=content, headers={"content-type": "application/json"})
        except httpx.HTTPError as exc:
            raise RemoteEnvError(f"POST {self.options.base_url}{path} failed: {exc!r}") from exc
        if response.is_error:
            try:
                message = response.json().get("error", response.text)
            except ValueError:
                message = response.text
            raise RemoteEnvError(f"POST {path} -> HTTP {response.status_code}: {message}")
        return response.json()


def _text(observation: Any) -> str:
    """Servers may return an observation object (e.g. SciWorld); the model reads it as JSON text."""
    return observation if isinstance(observation, str) else json.dumps(observation)

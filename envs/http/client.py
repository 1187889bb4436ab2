"""``AgentGymClient``: a ``TextEnv`` that plays a remote AgentGym-style env server over HTTP.

Registered as env ``agentgym-remote``, so an ``EnvActor`` (or a config's ``env.name``) can use any
AgentGym server: this project's ``agentgym-rl env-server`` or AgentGym's own servers, including envs
this project does not implement. When ``env_name`` names one of our envs, its instruction, action
parser and task splits are reused and the model's whole reply is sent, so the remote env parses
exactly what the in-process env would; otherwise the ``instruction`` and ``splits`` options are
used and the action is read from an ``Action:`` line and sent bare, as AgentGym's clients do.
Server errors (4xx/5xx with ``{"error": ...}``) and unreachable servers raise ``RemoteEnvError``.

The ``protocol`` option picks the request bodies and response fields of one AgentGym server (the
table in ``envs.http.server``): ``agentgym`` (BabyAI's), ``textcraft`` (``/create`` takes a JSON
body), ``sciworld`` (the first observation is ``task_description`` and ``observation`` joined by a
newline, as AgentGym's client shows it; rewards on the 0-100 scale are divided by 100, as this
project's SciWorld env rewards), ``searchqa`` (``env_idx``; ``/create {"id": task}``) and ``webarena``
(``env_idx``; ``/reset {env_idx, seed: 0, idx}``, then ``GET /observation`` for the full prompt;
``done`` is ``terminated or truncated``).

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

from agentgym_rl.envs.base import EnvError, InvalidAction, Observation, StepResult, TextEnv
from agentgym_rl.envs.http.models import PROTOCOLS, SCIWORLD_SCALE, Protocol, default_protocol
from agentgym_rl.envs.registry import make

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
        protocol: Protocol | None = Field(
            default=None,
            description="Which AgentGym server's shapes: 'agentgym' (BabyAI's common protocol), 'textcraft', "
            "'sciworld', 'searchqa' or 'webarena' (both `env_idx` bodies). None: the one that mirrors `env_name` "
            "(textcraft, sciworld, searchqa for search, webarena for web), else 'agentgym'.",
        )
        timeout: float = Field(default=60.0, gt=0, description="Seconds to wait for one HTTP request.")
        token: str | None = Field(default=None, description="Bearer token, when the server requires one.")

    def __init__(self, **options: Any) -> None:
        self.options = self.Options(**options)
        headers = {"Authorization": f"Bearer {self.options.token}"} if self.options.token else {}
        self._http = httpx.Client(base_url=self.options.base_url, timeout=self.options.timeout, headers=headers)
        self._id: int | None = None
        self._protocol: Protocol = self.options.protocol or default_protocol(self.options.env_name)
        self._key = "env_idx" if self._protocol in ("searchqa", "webarena") else "id"

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
            self._id = self._create(task_id)
        if self._protocol == "searchqa":
            return Observation(text=self._call("POST", "/reset", {"env_idx": self._id, "id": task_id}, shape=str))
        if self._protocol == "webarena":
            body = self._call("POST", "/reset", {"env_idx": self._id, "seed": 0, "idx": task_id}, ("observation",))
            if body["observation"] == "TimeoutError":  # how AgentGym's WebArena server reports a failed reset
                raise RemoteEnvError(f"the WebArena server timed out resetting task {task_id}; restart its browsers")
            # Its /reset answers the page's tree alone; /observation is the whole prompt the model reads.
            prompt = self._call("GET", "/observation", params={"env_idx": self._id}, shape=str)
            info = {"sites": body.get("sites"), "intent": body.get("object"), **dict(body.get("info") or {})}
            return Observation(text=prompt, info=info)
        if self._protocol == "sciworld":
            fields = ("task_name", "var_num", "task_description", "observation")
            body = self._call("POST", "/reset", {"id": self._id, "data_idx": task_id}, fields)
            info = {**dict(body.get("info") or {}), "task_name": body["task_name"], "variation": body["var_num"]}
            return Observation(text=f"{body['task_description']}\n{_text(body['observation'])}", info=info)
        body = self._call("POST", "/reset", {"id": self._id, "data_idx": task_id}, ("observation",))
        return Observation(text=_text(body["observation"]), info=dict(body.get("info") or {}))

    def step(self, action_text: str) -> StepResult:
        """Send the reply, or the action parsed from it, per the ``action_format`` option."""
        if self._id is None:
            raise EnvError("no episode has started; call reset first")
        send_reply = self.options.action_format == "reply" or (
            self.options.action_format is None and self.options.env_name is not None
        )
        action = None if send_reply else self.parse_action(action_text)
        if isinstance(action, str):
            request = {self._key: self._id, "action": action}
        else:
            # `verbatim` stops this project's server from reading the reply as a bare action, so its env
            # parses exactly what the model wrote (AgentGym's servers ignore the extra field).
            request = {self._key: self._id, "action": action_text, "verbatim": True}
        ends = ("terminated",) if self._protocol == "webarena" else ("done",)
        body = self._call("POST", "/step", request, ("observation", "reward", *ends))
        info = dict(body.get("info") or {})
        if "score" in body:
            info.setdefault("score", body["score"])
        reward = float(body["reward"])
        if self._protocol == "sciworld":
            reward /= SCIWORLD_SCALE
        done = bool(body["terminated"] or body.get("truncated")) if self._protocol == "webarena" else bool(body["done"])
        return StepResult(observation=_text(body["observation"]), reward=reward, done=done, info=info)

    def _create(self, task_id: int) -> int:
        """A new remote env's id, created with the body its server expects."""
        if self._protocol == "searchqa":
            # AgentGym's SearchQA server requires an item to start with; it answers a bare index.
            return self._call("POST", "/create", {"id": task_id}, shape=int)
        if self._protocol == "webarena":
            return int(self._call("POST", "/create", fields=("env_idx",))["env_idx"])
        # AgentGym's TextCraft server reads an (empty) JSON body at /create; the others read none.
        body = {} if self._protocol == "textcraft" else None
        return int(self._call("POST", "/create", body, ("id",))["id"])

    def close(self) -> None:
        """Free the remote env (best effort: the server may already be gone) and the HTTP connection."""
        # A server that is gone has freed the env already.
        with contextlib.suppress(RemoteEnvError):
            if self._id is not None:
                self._request("POST", "/close", {self._key: self._id})  # answers differ: bool, object
        self._id = None
        self._http.close()
        if self.__dict__.get("_local") is not None:  # only when the cached local env was ever made
            self._local.close()

    def _call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        fields: tuple[str, ...] = (),
        *,
        params: dict[str, Any] | None = None,
        shape: type = dict,
    ) -> Any:
        """``_request``'s answer, checked to be a ``shape`` (with ``fields`` for an object): a server of another
        shape than the ``protocol`` option says is reported as such, not as a KeyError."""
        data = self._request(method, path, body, params=params)
        missing = [key for key in fields if key not in data] if isinstance(data, dict) else list(fields)
        if not isinstance(data, shape) or isinstance(data, bool) or missing:
            wanted = f"fields {missing}" if missing else f"a JSON {shape.__name__}"
            raise RemoteEnvError(
                f"{method} {path} answered {json.dumps(data)[:200]}, without {wanted} of AgentGym's {self._protocol} "
                f"protocol; set the `protocol` option to the shape of the server ({', '.join(PROTOCOLS)})"
            )
        return data

    def _request(
        self, method: str, path: str, body: dict[str, Any] | None = None, *, params: dict[str, Any] | None = None
    ) -> Any:
        try:
            # ASCII JSON: model text may hold lone surrogates, which UTF-8 cannot encode.
            content = json.dumps(body) if body is not None else None
            headers = {"content-type": "application/json"} if body is not None else {}
            response = self._http.request(method, path, content=content, params=params, headers=headers)
        except httpx.HTTPError as exc:
            raise RemoteEnvError(f"{method} {self.options.base_url}{path} failed: {exc!r}") from exc
        if response.is_error:
            try:
                message = response.json().get("error", response.text)
            except (ValueError, AttributeError):
                message = response.text[:500]
            raise RemoteEnvError(f"{method} {path} -> HTTP {response.status_code}: {message}")
        try:
            data = response.json()
        except ValueError as exc:
            raise RemoteEnvError(f"{method} {path} answered non-JSON: {response.text[:200]!r}") from exc
        if isinstance(data, dict) and set(data) == {"error"}:
            # AgentGym's own servers report errors so, with status 200.
            raise RemoteEnvError(f"{method} {path} -> HTTP {response.status_code} with an error: {data['error']}")
        return data


def _text(observation: Any) -> str:
    """Servers may return an observation object (e.g. SciWorld); the model reads it as JSON text."""
    return observation if isinstance(observation, str) else json.dumps(observation)

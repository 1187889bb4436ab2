"""``WebArenaClient``: a ``TextEnv`` that plays a real WebArena deployment through AgentGym's WebArena server.

AgentGym's ``agentenv-webarena`` server speaks an ``env_idx`` protocol:

=================================  =========================================================
POST /create                       ``{"env_idx": int}`` (slow: the server logs into every site)
POST /reset {env_idx, seed, idx}   ``{"observation": tree}``; ``idx`` picks ``config_files/<idx>.json``
GET  /observation?env_idx=         the full prompt (tree, URL, objective, previous action)
POST /step {env_idx, action}       ``{observation, reward, terminated, truncated, info}``
POST /close {env_idx}              the text ``closed``
=================================  =========================================================

The model's whole reply is sent to ``/step`` (the server extracts the fenced action itself); the reply is
parsed locally with the same WebArena parser as env ``web``. Registered as ``webarena-remote``.

Example (config)::

    env: {name: webarena-remote, options: {base_url: "http://127.0.0.1:8000", splits: {test: [0, 1, 2]}}}
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from typing import Any

import httpx
import pydantic
from pydantic import BaseModel, ConfigDict, Field

from agentgym_rl.envs.base import EnvError, InvalidAction, Observation, StepResult, TextEnv
from agentgym_rl.envs.http.client import RemoteEnvError
from agentgym_rl.envs.web.actions import ACTION_SYNTAX, parse_reply

WEBARENA_TASKS = 812  # WebArena's config_files/0.json .. 811.json
WEBARENA_INSTRUCTION = (
    "You are an autonomous agent browsing the web to accomplish a task. Every turn you receive the page's "
    "accessibility tree, where each element has a numeric id in square brackets, the current URL, the "
    f"objective and your previous action.\nActions: {ACTION_SYNTAX}.\n"
    "When the task is done, or it asks for an answer, issue stop with the answer in brackets.\n"
    "Think step by step, then give exactly one action in a fenced block, e.g. "
    "'In summary, the next action I will perform is ```click [12]```'."
)


class WebArenaClient(TextEnv):
    """One env on an AgentGym WebArena server (``/create``, ``/reset``, ``/observation``, ``/step``, ``/close``)."""

    name = "webarena-remote"
    default_max_turns = 15  # the paper's WebArena evaluation

    class Options(BaseModel):
        """Options of the WebArena client."""

        model_config = ConfigDict(extra="forbid")

        base_url: str = Field(description="Address of AgentGym's WebArena server, e.g. http://127.0.0.1:8000.")
        splits: dict[str, list[int]] = Field(
            default_factory=lambda: {"test": list(range(WEBARENA_TASKS))},
            description="Task ids (WebArena config indices) per split; default: all 812 as 'test'.",
        )
        seed: int = Field(default=0, description="The `seed` sent with /reset (AgentGym's server expects 0).")
        instruction: str = Field(default=WEBARENA_INSTRUCTION, description="System prompt given to the model.")
        timeout: float = Field(
            default=600.0, gt=0, description="Seconds to wait for one request (/create logs into every site)."
        )

    def __init__(self, **options: Any) -> None:
        try:
            self.options = self.Options(**options)
        except pydantic.ValidationError as exc:
            # A caller error, reported like other env start-up errors (`agentgym-rl envs` lists it so).
            raise EnvError(f"webarena-remote needs its server address (option base_url): {exc}") from exc
        self._http = httpx.Client(base_url=self.options.base_url, timeout=self.options.timeout)
        self._env_idx: int | None = None

    @property
    def instruction(self) -> str:
        """The ``instruction`` option."""
        return self.options.instruction

    def tasks(self, split: str) -> Sequence[int]:
        """Task ids of ``split`` from the ``splits`` option."""
        if split not in self.options.splits:
            raise EnvError(f"unknown split {split!r}; known splits: {', '.join(self.options.splits) or 'none'}")
        return list(self.options.splits[split])

    def parse_action(self, model_text: str) -> str | InvalidAction:
        """The reply's WebArena action (first fenced block), as env ``web`` parses it."""
        action = parse_reply(model_text)
        return action if isinstance(action, InvalidAction) else str(action)

    def reset(self, task_id: int) -> Observation:
        """Create the remote env on first use, reset it to WebArena task ``task_id``, return the full prompt."""
        if self._env_idx is None:
            self._env_idx = int(self._request("POST", "/create", None)["env_idx"])
        body = self._request("POST", "/reset", {"env_idx": self._env_idx, "seed": self.options.seed, "idx": task_id})
        prompt = self._request("GET", "/observation", None, params={"env_idx": self._env_idx})
        text = prompt if isinstance(prompt, str) else json.dumps(prompt)
        return Observation(text=text, info={"tree": body.get("observation", "")})

    def step(self, action_text: str) -> StepResult:
        """Send the model's whole reply; ``done`` is ``terminated or truncated``."""
        if self._env_idx is None:
            raise EnvError("no episode has started; call reset first")
        body = self._request("POST", "/step", {"env_idx": self._env_idx, "action": action_text})
        info = dict(body.get("info") or {})
        info.setdefault("action_valid", not isinstance(parse_reply(action_text), InvalidAction))
        observation = body["observation"]
        return StepResult(
            observation=observation if isinstance(observation, str) else json.dumps(observation),
            reward=float(body.get("reward") or 0.0),
            done=bool(body.get("terminated") or body.get("truncated")),
            info=info,
        )

    def close(self) -> None:
        """Close the remote env (best effort) and the HTTP connection."""
        if self._env_idx is not None:
            # A server that is gone has nothing left to close.
            with contextlib.suppress(RemoteEnvError):
                self._request("POST", "/close", {"env_idx": self._env_idx}, expect_json=False)
            self._env_idx = None
        self._http.close()

    def _request(
        self, method: str, path: str, body: dict[str, Any] | None, *, params: dict[str, Any] | None = None,
        expect_json: bool = True,
    ) -> Any:  # fmt: skip
        try:
            response = self._http.request(method, path, json=body, params=params)
        except httpx.HTTPError as exc:
            raise RemoteEnvError(f"{method} {self.options.base_url}{path} failed: {exc!r}") from exc
        if response.is_error:
            raise RemoteEnvError(f"{method} {path} -> HTTP {response.status_code}: {response.text[:500]}")
        if not expect_json:
            return response.text
        try:
            return response.json()
        except ValueError as exc:
            raise RemoteEnvError(f"{method} {path} answered non-JSON: {response.text[:200]!r}") from exc

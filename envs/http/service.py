"""The env instances behind the HTTP server: creation under a cap, one lock per env, a thread pool.

Protocol-free: the routes of ``envs.http.server`` translate requests into these calls and
``ServerError`` into HTTP statuses.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import structlog
from fastapi.encoders import jsonable_encoder
from starlette.concurrency import run_in_threadpool

from envs.base import EnvError, InvalidAction, TextEnv
from envs.http.models import ServerOptions
from envs.registry import make

log = structlog.get_logger()
T = TypeVar("T")


class ServerError(Exception):
    """An error with the HTTP status it maps to; the one exception the service and routes raise."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Session:
    """One live env instance and its episode state."""

    env: TextEnv
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    observation: str = ""
    score: float = 0.0
    started: bool = False
    done: bool = False
    closed: bool = False


def _env_action(env: TextEnv, action: str) -> str:
    """The text to hand to ``env.step``: bare actions (AgentGym clients send those) gain an ``Action:`` prefix."""
    if isinstance(env.parse_action(action), InvalidAction):
        prefixed = f"Action: {action}"
        if not isinstance(env.parse_action(prefixed), InvalidAction):
            return prefixed
    return action


class EnvService:
    """Live envs by id (ids count up from 0), at most ``max_envs`` at once."""

    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        self.sessions: dict[int, Session] = {}
        self._reserved = 0  # creations in flight, counted against the cap
        self._ids = itertools.count()

    async def create(self) -> int:
        """A new env's id. 429 at the cap, 503 when the env cannot start on this machine."""
        if len(self.sessions) + self._reserved >= self.options.max_envs:
            raise ServerError(
                429, f"{self.options.max_envs} envs are live, the server's limit (--max-envs); POST /close unused ones"
            )
        self._reserved += 1
        try:
            env = await self._call(-1, "create", lambda: make(self.options.env_name, self.options.env_options))
        except EnvError as exc:
            raise ServerError(503, f"cannot start a {self.options.env_name} env here: {exc}") from exc
        finally:
            # Released either way; on success the env is added with no await in between.
            self._reserved -= 1
        env_id = next(self._ids)
        self.sessions[env_id] = Session(env=env)
        return env_id

    async def reset(self, env_id: int, task_id: int) -> tuple[str, dict[str, Any]]:
        """(observation, info) of task ``task_id`` in env ``env_id``; 400 for a task id the env refuses."""
        session = self._get(env_id)
        async with session.lock:
            self._check_open(env_id, session)
            try:
                obs = await self._call(env_id, "reset", lambda: session.env.reset(task_id))
            except EnvError as exc:
                raise ServerError(400, f"cannot reset env {env_id} to task {task_id}: {exc}") from exc
            session.observation, session.score, session.started, session.done = obs.text, 0.0, True, False
            return obs.text, jsonable_encoder(obs.info)

    async def step(self, env_id: int, action: str, verbatim: bool) -> dict[str, Any]:
        """``{observation, reward, score, done, info}`` of one step; 409 before reset or after the end."""
        if len(action) > self.options.max_action_chars:
            raise ServerError(
                413, f"action has {len(action)} characters; this server accepts at most {self.options.max_action_chars}"
            )
        session = self._get(env_id)
        async with session.lock:
            self._check_open(env_id, session)
            if not session.started:
                raise ServerError(409, f"env {env_id} has no episode yet; POST /reset first")
            if session.done:
                raise ServerError(409, f"the episode of env {env_id} is over; POST /reset to start another")
            env = session.env

            def run() -> Any:
                return env.step(action if verbatim else _env_action(env, action))

            try:
                result = await self._call(env_id, "step", run)
            except EnvError as exc:
                raise ServerError(409, f"env {env_id} refused the step: {exc}") from exc
            session.observation, session.done = result.observation, result.done
            session.score += result.reward
            return {
                "observation": result.observation,
                "reward": result.reward,
                "score": session.score,
                "done": result.done,
                "info": jsonable_encoder(result.info),
            }

    def observation(self, env_id: int) -> str:
        """The latest observation of env ``env_id``."""
        session = self._get(env_id)
        if not session.started:
            raise ServerError(409, f"env {env_id} has no episode yet; POST /reset first")
        return session.observation

    async def close(self, env_id: int) -> None:
        """Free env ``env_id``; later requests for it get 404."""
        session = self._get(env_id)
        async with session.lock:  # waits for a step in flight on this env
            self._check_open(env_id, session)
            session.closed = True
            del self.sessions[env_id]
            await self._call(env_id, "close", session.env.close)

    def _get(self, env_id: int) -> Session:
        if env_id not in self.sessions:
            raise ServerError(404, f"unknown env id {env_id}; POST /create makes one (closed ids are gone)")
        return self.sessions[env_id]

    @staticmethod
    def _check_open(env_id: int, session: Session) -> None:
        # Called holding the session's lock: the env may have been closed while the request waited.
        if session.closed:
            raise ServerError(404, f"env {env_id} was closed; POST /create makes a new one")

    @staticmethod
    async def _call(env_id: int, what: str, fn: Callable[[], T]) -> T:
        """Run a blocking env call in the thread pool; an unexpected exception becomes a 500."""
        try:
            return await run_in_threadpool(fn)
        except (EnvError, ServerError):
            raise
        except Exception as exc:
            log.exception("env raised", env_id=env_id, call=what)
            raise ServerError(500, f"env {env_id} raised {type(exc).__name__} during {what}: {exc}") from exc

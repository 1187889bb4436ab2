"""The env instances behind the HTTP server: creation under a cap, one lock per env, a thread pool.

Protocol-free: the routes of ``envs.http.server`` translate requests into these calls and
``ServerError`` into HTTP statuses.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import structlog
from fastapi.encoders import jsonable_encoder
from starlette.concurrency import run_in_threadpool

from agentgym_rl.envs.base import EnvError, Observation, TextEnv, reply_of_action
from agentgym_rl.envs.http.models import ServerOptions
from agentgym_rl.envs.registry import make

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
    reward: float = 0.0  # of the last step
    score: float = 0.0
    started: bool = False
    done: bool = False
    closed: bool = False


class EnvService:
    """Live envs by id (ids count up from 0 and are never reused), at most ``max_envs`` at once."""

    def __init__(self, options: ServerOptions) -> None:
        self.options = options
        self.sessions: dict[int, Session] = {}
        self._reserved = 0  # creations in flight, counted against the cap
        self._issued = 0  # ids handed out so far: an id below this that is not live was closed

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
        env_id = self._issued
        self._issued += 1
        self.sessions[env_id] = Session(env=env)
        return env_id

    async def reset(self, env_id: int, task_id: int) -> tuple[str, dict[str, Any]]:
        """(observation, info) of task ``task_id`` in env ``env_id``; 400 for a task id the env refuses."""
        return await self.begin(env_id, lambda env: env.reset(task_id), f"task {task_id}")

    async def begin(
        self, env_id: int, start: Callable[[TextEnv], Observation], what: str
    ) -> tuple[str, dict[str, Any]]:
        """Start an episode in env ``env_id`` with ``start(env)`` (a reset, or an env's own way to begin, such
        as TextCraft's goal of the caller's); returns (observation, info). 400 when the env refuses ``what``."""
        session = self._get(env_id)
        async with session.lock:
            self._check_open(env_id, session)
            try:
                obs = await self._call(env_id, "reset", lambda: start(session.env))
            except EnvError as exc:
                raise ServerError(404, f"cannot reset env {env_id} to {what}: {exc}") from exc
            session.observation, session.reward, session.score = obs.text, 0.0, 0.0
            session.started, session.done = True, False
            return obs.text, jsonable_encoder(obs.info)

    async def task_ids(self, env_id: int) -> list[int]:
        """Every task id of env ``env_id`` (both splits), ascending."""
        env = self._get(env_id).env
        return await self._call(env_id, "tasks", lambda: sorted({*env.tasks("train"), *env.tasks("test")}))

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
                return env.step(action if verbatim else reply_of_action(env, action))

            try:
                result = await self._call(env_id, "step", run)
            except EnvError as exc:
                raise ServerError(409, f"env {env_id} refused the step: {exc}") from exc
            session.observation, session.done, session.reward = result.observation, result.done, result.reward
            session.score += result.reward
            return {
                "observation": result.observation,
                "reward": result.reward,
                "score": session.score,
                "done": result.done,
                "info": jsonable_encoder(result.info),
            }

    def episode(self, env_id: int) -> Session:
        """The live session of env ``env_id`` once an episode has started (its env, latest observation,
        reward, running score, done); 409 before the first reset."""
        session = self._get(env_id)
        if not session.started:
            raise ServerError(409, f"env {env_id} has no episode yet; POST /reset first")
        return session

    async def close(self, env_id: int) -> bool:
        """Free env ``env_id``: True; False for an id that was closed already (AgentGym's servers answer a
        second close so); 404 for an id never handed out. Later requests for a closed id get 404."""
        if env_id not in self.sessions and 0 <= env_id < self._issued:
            return False
        session = self._get(env_id)
        async with session.lock:  # waits for a step in flight on this env
            if session.closed:  # closed while this request waited for the lock
                return False
            session.closed = True
            del self.sessions[env_id]
            await self._call(env_id, "close", session.env.close)
            return True

    def _get(self, env_id: int) -> Session:
        if env_id not in self.sessions:
            if 0 <= env_id < self._issued:
                raise ServerError(404, f"env id {env_id} was closed; POST /create makes a new one")
            raise ServerError(404, f"unknown env id {env_id}; POST /create makes one")
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

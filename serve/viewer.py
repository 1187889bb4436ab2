"""The trajectory viewer: a static page plus JSON routes over one run directory.

``agentgym-rl view RUN_DIR`` serves it on 127.0.0.1. Routes (all GET; errors are JSON ``{"error": ...}``):

* ``/``: the page (``serve/static/``).
* ``/api/run``: run name, env, model, iterations planned.
* ``/api/iterations``: iterations that have a trajectory file, each with its metrics.jsonl line (or null).
* ``/api/episodes?iteration=N``: episode summaries; optional filters ``env``, ``task``, ``success``,
  ``truncated``, ``min_reward``, ``max_reward``.
* ``/api/episode/{iteration}/{index}``: one episode turn by turn: observation, raw reply, the env's
  parsed action, reward, and the turn's context and loss-masked (sampled) tokens, decoded.
* ``/api/frame/{iteration}/{index}/{step}.png``: the env's frame (``TextEnv.render_frame``, e.g. the BabyAI
  grid) after ``step`` actions (0 = after reset), replayed from the task id and the recorded replies.

Files are re-read when their size or modification time changes, so the page follows a live run.
"""

from __future__ import annotations

import json
import struct
import threading
import zlib
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from transformers import PreTrainedTokenizerBase

from agentgym_rl.actors.model_store import ModelError, load_tokenizer
from agentgym_rl.actors.rundir import CONFIG_FILE, METRICS_FILE
from agentgym_rl.actors.trajectory import Trajectory
from agentgym_rl.configs import ConfigError, load_config
from agentgym_rl.configs.errors import AgentGymError
from agentgym_rl.envs import EnvError, InvalidAction, TextEnv, env_class, make

STATIC = Path(__file__).parent / "static"
# Episodes whose frames are kept in memory (each is a list of small PNGs).
FRAME_CACHE_EPISODES = 32

T = TypeVar("T")


class ViewerError(AgentGymError):
    """A request the run directory cannot answer; ``status`` is the HTTP status it maps to."""

    def __init__(self, message: str, status: int = 404) -> None:
        super().__init__(message)
        self.status = status


def encode_png(rgb: np.ndarray) -> bytes:
    """Encode an ``(H, W, 3)`` uint8 image as PNG (8-bit RGB, no filtering)."""
    height, width, _ = rgb.shape
    rows = np.concatenate([np.zeros((height, 1), np.uint8), rgb.astype(np.uint8).reshape(height, width * 3)], axis=1)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows.tobytes()))
        + chunk(b"IEND", b"")
    )


class RunReader:
    """Reads one run directory for the viewer; caches parsed files until they change.

    Args:
        path: a run directory written by ``agentgym-rl train`` (holds ``config.yaml``).

    Raises:
        ViewerError: ``path`` is not a run directory.
    """

    def __init__(self, path: Path) -> None:
        if not (path / CONFIG_FILE).is_file():
            raise ViewerError(
                f"{path} is not a run directory: it has no {CONFIG_FILE} (give a directory made by train)"
            )
        try:
            self.config = load_config(path / CONFIG_FILE)
        except ConfigError as exc:
            raise ViewerError(f"cannot read the run's {CONFIG_FILE}: {exc}", status=500) from exc
        self.path = path
        self._files: dict[Path, tuple[tuple[int, int], Any]] = {}
        self._envs: dict[str, TextEnv] = {}
        self._frames: dict[tuple[int, int], list[bytes]] = {}
        self._lock = threading.Lock()

    @cached_property
    def tokenizer(self) -> PreTrainedTokenizerBase | str:
        """The run's tokenizer, or why it cannot be loaded here (the page then shows counts only)."""
        try:
            return load_tokenizer(self.config.model.name)
        except (ModelError, OSError) as exc:
            return f"tokenizer of model {self.config.model.name!r} unavailable: {exc}"

    def _cached(self, path: Path, parse: Callable[[str], T]) -> T:
        """``parse(text)`` of ``path``, recomputed only when its size or mtime changes."""
        stat = path.stat()
        key = (stat.st_size, stat.st_mtime_ns)
        with self._lock:
            hit = self._files.get(path)
            if hit is not None and hit[0] == key:
                return hit[1]
        value = parse(path.read_text())
        with self._lock:
            self._files[path] = (key, value)
        return value

    @staticmethod
    def _parse_trajectories(path: Path, text: str) -> list[Trajectory]:
        lines = [line for line in text.splitlines() if line.strip()]
        parsed = []
        for number, line in enumerate(lines):
            try:
                parsed.append(Trajectory.model_validate_json(line))
            except ValidationError as exc:
                if number == len(lines) - 1:
                    break  # the trainer is still writing this line; it shows up on a later poll
                raise ViewerError(f"{path} line {number + 1} is not a trajectory: {exc}", status=500) from exc
        return parsed

    def metrics(self) -> list[dict]:
        path = self.path / METRICS_FILE
        if not path.is_file():
            return []
        # A line being appended right now is incomplete JSON; skip it until the next poll.
        return self._cached(path, lambda text: [json.loads(x) for x in text.splitlines() if x.endswith("}")])

    def iteration_files(self) -> dict[int, Path]:
        return {int(p.stem.split("_")[1]): p for p in sorted((self.path / "trajectories").glob("iter_*.jsonl"))}

    def trajectories(self, iteration: int) -> list[Trajectory]:
        path = self.iteration_files().get(iteration)
        if path is None:
            raise ViewerError(f"iteration {iteration} has no trajectory file in {self.path / 'trajectories'}")
        return self._cached(path, lambda text: self._parse_trajectories(path, text))

    def trajectory(self, iteration: int, index: int) -> Trajectory:
        episodes = self.trajectories(iteration)
        if not 0 <= index < len(episodes):
            raise ViewerError(f"iteration {iteration} has episodes 0..{len(episodes) - 1}, not {index}")
        return episodes[index]

    def run_info(self) -> dict:
        cfg = self.config
        return {
            "name": self.path.name,
            "path": str(self.path),
            "env": cfg.env.name,
            "model": cfg.model.name,
            "iterations": cfg.trainer.iterations,
        }

    def iterations(self) -> list[dict]:
        by_iteration = {int(r["iteration"]): r for r in self.metrics()}
        rows = []
        for iteration in self.iteration_files():
            episodes = self.trajectories(iteration)
            rows.append(
                {
                    "iteration": iteration,
                    "episodes": len(episodes),
                    "successes": sum(t.success for t in episodes),
                    "metrics": by_iteration.get(iteration),
                }
            )
        return rows

    def episodes(self, iteration: int, filters: dict[str, Any]) -> list[dict]:
        rows = []
        for index, t in enumerate(self.trajectories(iteration)):
            if (
                (filters.get("env") is not None and t.env != filters["env"])
                or (filters.get("task") is not None and t.task_id != filters["task"])
                or (filters.get("success") is not None and t.success != filters["success"])
                or (filters.get("truncated") is not None and t.truncated != filters["truncated"])
                or (filters.get("min_reward") is not None and t.reward < filters["min_reward"])
                or (filters.get("max_reward") is not None and t.reward > filters["max_reward"])
            ):
                continue
            rows.append({"index": index, **self._summary(t)})
        return rows

    @staticmethod
    def _summary(t: Trajectory) -> dict:
        return {
            "env": t.env,
            "task_id": t.task_id,
            "group": t.group,
            "reward": t.reward,
            "success": t.success,
            "done": t.done,
            "truncated": t.truncated,
            "truncation_reason": t.truncation_reason,
            "turns": t.num_turns,
            "horizon": t.horizon,
            "tokens": len(t.token_ids),
            "sampled_tokens": t.num_sampled_tokens,
            "weights_version": t.weights_version,
        }

    def _env(self, name: str) -> TextEnv:
        if name not in self._envs:
            options = self.config.env.options if name == self.config.env.name else {}
            self._envs[name] = make(name, options)
        return self._envs[name]

    def _decode(self, token_ids: list[int]) -> str | None:
        if isinstance(self.tokenizer, str):
            return None
        return self.tokenizer.decode(token_ids, skip_special_tokens=False)

    def _parsed_actions(self, t: Trajectory) -> tuple[list[str | InvalidAction | None], list[str]]:
        """The env's ``parse_action`` of each reply, or Nones and a note when the env cannot be made here."""
        try:
            with self._lock:
                env = self._env(t.env)
                return [env.parse_action(action) for action in t.actions], []
        except (EnvError, ValueError, ImportError, OSError) as exc:
            return [None] * len(t.actions), [f"env {t.env!r} cannot be created here to parse actions: {exc}"]

    def episode(self, iteration: int, index: int) -> dict:
        """One episode turn by turn; token text comes from the run's tokenizer."""
        t = self.trajectory(iteration, index)
        ids, mask = t.token_ids, t.loss_mask
        # messages: system, first observation, then (reply, next observation) per turn; the last
        # observation is missing when the env ended the episode.
        observations = [m["content"] for m in t.messages if m["role"] == "user"]
        parsed, notes = self._parsed_actions(t)
        if isinstance(self.tokenizer, str):
            notes.append(self.tokenizer)
        turns = []
        previous_end = t.prompt_length
        for turn, (start, end) in enumerate(t.turn_spans):
            action = parsed[turn]
            turns.append(
                {
                    "turn": turn,
                    "observation": observations[turn],
                    "reply": t.actions[turn],
                    "action": action if isinstance(action, str) else None,
                    "invalid_reason": action.reason if isinstance(action, InvalidAction) else None,
                    "reward": t.step_rewards[turn],
                    "next_observation": observations[turn + 1] if turn + 1 < len(observations) else None,
                    "context": {"text": self._decode(ids[previous_end:start]), "tokens": start - previous_end},
                    "sampled": {"text": self._decode(ids[start:end]), "tokens": end - start},
                    "sampled_mask_ok": all(mask[start:end]) and not any(mask[previous_end:start]),
                }
            )
            previous_end = end
        return {
            "iteration": iteration,
            "index": index,
            **self._summary(t),
            "system": t.messages[0]["content"],
            "prompt": {"text": self._decode(ids[: t.prompt_length]), "tokens": t.prompt_length},
            "turns": turns,
            "frames": self._has_frames(t.env),
            "notes": notes,
        }

    def frame(self, iteration: int, index: int, step: int) -> bytes:
        """PNG of the env's frame after ``step`` actions, replayed from the task id and the actions."""
        t = self.trajectory(iteration, index)
        if not self._has_frames(t.env):
            raise ViewerError(f"episode {iteration}/{index} is a {t.env!r} episode; env {t.env!r} has no frames")
        key = (iteration, index)
        with self._lock:
            frames = self._frames.get(key)
            if frames is None:
                frames = self._replay(t)
                if len(self._frames) >= FRAME_CACHE_EPISODES:
                    self._frames.pop(next(iter(self._frames)))
                self._frames[key] = frames
        if not 0 <= step < len(frames):
            raise ViewerError(f"episode {iteration}/{index} has frames 0..{len(frames) - 1}, not {step}")
        return frames[step]

    @staticmethod
    def _has_frames(name: str) -> bool:
        """Whether env ``name`` renders frames; False for an env this process cannot import."""
        try:
            return env_class(name).has_frames()
        except (EnvError, ImportError):
            return False

    def _replay(self, t: Trajectory) -> list[bytes]:
        # A replay env of its own, with the run's options (levels, step caps) less what a replay does not use.
        options = dict(self.config.env.options) if t.env == self.config.env.name else {}
        env = make(t.env, env_class(t.env).replay_options(options))
        try:
            env.reset(t.task_id)
            frames = [encode_png(env.render_frame())]
            for action in t.actions:
                env.step(action)
                frames.append(encode_png(env.render_frame()))
            return frames
        finally:
            env.close()


def build_app(run_dir: Path) -> FastAPI:
    """The viewer app for ``run_dir``.

    Raises:
        ViewerError: ``run_dir`` is not a run directory.
    """
    reader = RunReader(run_dir)
    app = FastAPI(title="agentgym-rl trajectory viewer", docs_url=None, redoc_url=None, openapi_url=None)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.exception_handler(ViewerError)
    async def viewer_error(request: Request, exc: ViewerError) -> JSONResponse:
        return JSONResponse({"error": str(exc)}, status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = f"no route {request.url.path}" if exc.status_code == 404 else str(exc.detail)
        return JSONResponse({"error": detail}, status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        return JSONResponse({"error": f"bad request: {problems}"}, status_code=422)

    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    @app.get("/api/run")
    def run() -> dict:
        return reader.run_info()

    @app.get("/api/iterations")
    def iterations() -> list[dict]:
        return reader.iterations()

    @app.get("/api/episodes")
    def episodes(
        iteration: int,
        env: str | None = None,
        task: int | None = None,
        success: bool | None = None,
        truncated: bool | None = None,
        min_reward: float | None = None,
        max_reward: float | None = None,
    ) -> list[dict]:
        filters = {
            "env": env,
            "task": task,
            "success": success,
            "truncated": truncated,
            "min_reward": min_reward,
            "max_reward": max_reward,
        }
        return reader.episodes(iteration, filters)

    @app.get("/api/episode/{iteration}/{index}")
    def episode(iteration: int, index: int) -> dict:
        return reader.episode(iteration, index)

    @app.get("/api/frame/{iteration}/{index}/{step}.png")
    def frame(iteration: int, index: int, step: int) -> Response:
        return Response(reader.frame(iteration, index, step), media_type="image/png")

    return app


def serve_viewer(run_dir: Path, host: str = "127.0.0.1", port: int = 8265) -> None:
    """Serve the viewer for ``run_dir`` until interrupted."""
    import uvicorn

    app = build_app(run_dir)
    print(f"trajectory viewer for {run_dir}: http://{host}:{port}/", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")

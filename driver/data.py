"""Trajectory data in and out of run directories: the export format, export, import, loading.

The export format is JSON Lines, one episode per line (:class:`Episode`): ``env``, ``task_id``,
``messages`` ([{role, content}]: system, user, then assistant and user turns), ``actions``,
``step_rewards``, ``reward``, ``success``, ``done``, ``truncated``, ``iteration``, and, when the
episode is token-exact, ``token_ids`` and ``loss_mask``. Import keeps the ids when they are there
and otherwise renders the messages with the model's chat template: the system and first user
message as the prompt, each assistant reply encoded and closed with the end-of-turn token (loss
mask 1), and each following user message as the template's continuation (loss mask 0). That is
exact for replies that end their turn and survive decoding and encoding (oracle and logged text).
"""

from __future__ import annotations

import glob
import json
from collections.abc import Iterable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agentgym_rl.actors.chat import ChatFormat
from agentgym_rl.actors.model_store import load_tokenizer
from agentgym_rl.actors.rundir import RunDir
from agentgym_rl.actors.trajectory import Trajectory, sampled_spans
from agentgym_rl.configs.errors import AgentGymError


class DataError(AgentGymError, ValueError):
    """Trajectory data that cannot be read or written; the message names the file and line."""


class Episode(BaseModel):
    """One exported episode (one line of an export file)."""

    model_config = ConfigDict(extra="forbid")

    env: str = Field(description="Registered env name.")
    task_id: int = Field(description="Task id within the env.")
    messages: list[dict[str, str]] = Field(description="The conversation: [{role, content}], system first.")
    actions: list[str] | None = Field(None, description="Reply text of each turn; None: the assistant messages.")
    step_rewards: list[float] | None = Field(None, description="Reward of each turn; None: all on the last turn.")
    reward: float = Field(description="Outcome reward.")
    success: bool = Field(description="The task was solved.")
    done: bool = Field(True, description="The environment ended the episode.")
    truncated: bool = Field(False, description="A turn or context limit cut the episode.")
    iteration: int = Field(0, ge=0, description="Iteration (or round) that produced the episode.")
    token_ids: list[int] | None = Field(None, description="Token-exact conversation, when known.")
    loss_mask: list[int] | None = Field(None, description="1 on sampled tokens; given together with token_ids.")

    @model_validator(mode="after")
    def _ids_with_mask(self) -> Episode:
        if (self.token_ids is None) != (self.loss_mask is None):
            raise ValueError("token_ids and loss_mask go together: give both or neither")
        if self.token_ids is not None and len(self.token_ids) != len(self.loss_mask):
            raise ValueError(
                f"token_ids ({len(self.token_ids)}) and loss_mask ({len(self.loss_mask)}) differ in length"
            )
        if not any(m.get("role") == "assistant" for m in self.messages):
            raise ValueError("messages hold no assistant reply, so there is nothing to train on")
        return self


def trajectory_files(sources: Iterable[str]) -> list[Path]:
    """The trajectory files behind ``sources``: files, run directories (their ``trajectories/*.jsonl``,
    in order) or glob patterns.

    Raises:
        DataError: a source that matches no file.
    """
    files: list[Path] = []
    for source in sources:
        path = Path(source)
        if path.is_dir():
            found = sorted((path / "trajectories").glob("*.jsonl")) or sorted(path.glob("*.jsonl"))
        elif path.is_file():
            found = [path]
        else:
            found = [Path(p) for p in sorted(glob.glob(source))]
        if not found:
            raise DataError(f"{source}: no trajectory file there (give a .jsonl file, a run directory or a glob)")
        files.extend(found)
    return files


def _lines(path: Path) -> Iterable[tuple[int, dict]]:
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip():
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{number}: not JSON: {exc}") from None


def load_trajectories(sources: Iterable[str]) -> list[Trajectory]:
    """Every trajectory in ``sources`` (run-directory ``Trajectory`` lines), in file order."""
    trajectories = []
    for path in trajectory_files(sources):
        for number, record in _lines(path):
            try:
                trajectories.append(Trajectory.model_validate(record))
            except ValidationError as exc:
                raise DataError(
                    f"{path}:{number}: not a trajectory ({exc.errors()[0]['loc']}: {exc.errors()[0]['msg']}); "
                    "convert exported episodes with `agentgym-rl data import`"
                ) from None
    return trajectories


def to_episode(trajectory: Trajectory, iteration: int) -> Episode:
    return Episode(
        env=trajectory.env,
        task_id=trajectory.task_id,
        messages=trajectory.messages,
        actions=trajectory.actions,
        step_rewards=trajectory.step_rewards,
        reward=trajectory.reward,
        success=trajectory.success,
        done=trajectory.done,
        truncated=trajectory.truncated,
        iteration=iteration,
        token_ids=trajectory.token_ids,
        loss_mask=trajectory.loss_mask,
    )


def export_run(run_dir: Path, output: Path) -> int:
    """Write every trajectory of ``run_dir`` to ``output`` in the export format; returns the count."""
    files = trajectory_files([str(run_dir / "trajectories")])
    count = 0
    with output.open("w") as handle:
        for path in files:
            iteration = int(path.stem.rsplit("_", 1)[-1]) if path.stem.startswith("iter_") else 0
            for trajectory in load_trajectories([str(path)]):
                if trajectory.failed:  # the env broke; nothing to learn from
                    continue
                handle.write(to_episode(trajectory, iteration).model_dump_json(exclude_none=True) + "\n")
                count += 1
    return count


def render_episode(episode: Episode, chat: ChatFormat) -> tuple[list[int], list[int]]:
    """``(token_ids, loss_mask)`` of ``episode``'s messages, as a rollout would have produced them.

    Raises:
        DataError: the messages do not start with [system,] user or do not alternate after it.
    """
    messages = episode.messages
    opening = 2 if messages and messages[0].get("role") == "system" else 1
    if len(messages) <= opening or messages[opening - 1].get("role") != "user":
        raise DataError("messages must open with an optional system message and a user message")
    token_ids = chat.prompt_ids(messages[:opening])
    loss_mask = [0] * len(token_ids)
    reply: list[int] = []
    rest = messages[opening:]
    for k, message in enumerate(rest):
        expected = "assistant" if k % 2 == 0 else "user"
        if message.get("role") != expected:
            raise DataError(f"message {opening + k} has role {message.get('role')!r}; expected {expected!r}")
        if expected == "assistant":
            reply = [*chat.encode(message["content"]), chat.tokenizer.eos_token_id]
            token_ids += reply
            loss_mask += [1] * len(reply)
        elif k + 1 < len(rest):  # an observation is only in the ids when another reply follows it
            continuation = chat.continuation_ids(reply, message["content"])
            token_ids += continuation
            loss_mask += [0] * len(continuation)
    return token_ids, loss_mask


def to_trajectory(episode: Episode, group: int, chat: ChatFormat | None) -> Trajectory:
    """The run-directory record of ``episode``; ``chat`` renders it when it carries no token ids."""
    if episode.token_ids is not None:
        token_ids, loss_mask = episode.token_ids, episode.loss_mask
    else:
        assert chat is not None, "episodes without token ids need a chat format"
        token_ids, loss_mask = render_episode(episode, chat)
    spans = sampled_spans(loss_mask)
    actions = episode.actions
    if actions is None:
        actions = [m["content"] for m in episode.messages if m.get("role") == "assistant"]
    step_rewards = episode.step_rewards
    if step_rewards is None:
        step_rewards = [0.0] * (len(spans) - 1) + [episode.reward]
    return Trajectory(
        env=episode.env,
        task_id=episode.task_id,
        group=group,
        token_ids=token_ids,
        loss_mask=loss_mask,
        logprobs=[0.0] * len(token_ids),
        prompt_length=spans[0][0] if spans else len(token_ids),
        turn_spans=spans,
        messages=episode.messages,
        actions=actions,
        step_rewards=step_rewards,
        reward=episode.reward,
        success=episode.success,
        done=episode.done,
        truncated=episode.truncated,
        truncation_reason="horizon" if episode.truncated else None,
        horizon=len(spans),
        weights_version=-1,
    )


def import_episodes(source: Path, run_dir: Path, model_name: str) -> int:
    """Convert the export file ``source`` into ``run_dir/trajectories/iter_000000.jsonl``.

    Episodes of one ``(env, task_id)`` share a group. ``model_name``'s tokenizer renders episodes
    without token ids. Returns the number of episodes.

    Raises:
        DataError: a bad line (named by file and line number), or a run directory that already
            holds trajectories.
    """
    target = RunDir(run_dir)
    if target.trajectories.is_dir() and any(target.trajectories.glob("*.jsonl")):
        raise DataError(f"{target.trajectories} already holds trajectories; import into a new directory")
    chat: ChatFormat | None = None
    groups: dict[tuple[str, int], int] = {}
    trajectories = []
    for number, record in _lines(source):
        try:
            episode = Episode.model_validate(record)
            if episode.token_ids is None and chat is None:
                chat = ChatFormat(load_tokenizer(model_name))
            group = groups.setdefault((episode.env, episode.task_id), len(groups))
            trajectories.append(to_trajectory(episode, group, chat))
        except (ValidationError, DataError) as exc:
            raise DataError(f"{source}:{number}: {exc}") from None
    if not trajectories:
        raise DataError(f"{source}: no episodes")
    target.trajectories.mkdir(parents=True, exist_ok=True)
    target.write_trajectories(0, trajectories)
    return len(trajectories)

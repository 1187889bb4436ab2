"""Episodes recorded on the endpoint: an agent written in any framework plays through ordinary chat calls,
and the endpoint keeps the token ids it sampled, never re-tokenized from text.

A client opens an episode (``POST /v1/episodes``) and gets its id and a token (``<id>.<secret>``) that tags
its chat calls (the ``X-Episode-Token`` header, or ``user: "episode:<token>"``) and closes it with a reward.
The book below builds each call's prompt ids itself:

- The first call's messages (no assistant message among them) are rendered with the chat template; they
  are the episode's opening.
- Every later call must repeat the conversation so far and add one user message: the opening, then per
  turn the reply as the endpoint returned it and the user message that followed. The recorded ids stand
  for that history, and only the new message is rendered, as the turn's continuation
  (``ChatFormat.continuation_ids``), so the ids trained on are the ids sampled. A reply or message the
  client changed is a mismatch: the call is still served (from the client's text) but the episode is
  marked and never trains.

A call is admitted under an id its route chose (``prepare``), and only that id records its reply or gives it
up (``record``, ``abandon``): a route releases the episode on every way out of the call, even one that left
before it learned whether the book admitted it, and never releases another call's.

Each client (``client_of`` in ``serve.routes``: its bearer key and address) holds at most
``serve.episodes.max_open_per_client`` open episodes, so one client's flood is refused to that client alone.

Closing posts one outcome reward or one per turn. An episode idle for ``serve.episodes.ttl_s`` expires and
is dropped. Closed episodes that did not mismatch become ``Trajectory`` records with the samplers' layout.
The book lives in one Ray actor (``serve.deployment.episode_store``) that every replica of the endpoint
asks, so the calls of one episode may reach any replica.
"""

from __future__ import annotations

import hmac
import secrets
import time
from dataclasses import dataclass, field
from typing import Literal

from agentgym_rl.actors.adapters import policy_source
from agentgym_rl.actors.chat import ChatFormat
from agentgym_rl.actors.model_store import load_tokenizer
from agentgym_rl.actors.trajectory import Trajectory
from agentgym_rl.configs.schema import EpisodesConfig

TOKEN_PREFIX = "episode:"  # what the `user` field carries before an episode token


@dataclass(frozen=True)
class Refusal:
    """Why the book turned a request down, as the route answers it (OpenAI's error shape)."""

    status: int
    message: str
    code: str
    param: str | None = None


@dataclass(frozen=True)
class Prepared:
    """A call the book admitted: the prompt ids to generate from, and whether its reply will be recorded."""

    prompt_ids: list[int]
    recorded: bool


@dataclass
class Episode:
    id: str
    secret: str
    env: str
    task_id: int
    group_key: str
    opened: float
    last_active: float
    client: str
    opening: list[dict[str, str]] = field(default_factory=list)
    messages: list[dict[str, str]] = field(default_factory=list)  # the conversation so far, as the client sees it
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    prompt_length: int = 0
    turn_spans: list[tuple[int, int]] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)
    turn_capped: list[bool] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    status: Literal["open", "closed"] = "open"
    mismatch: str | None = None
    truncated: bool = False
    pending: list[int] | None = None  # the continuation ids of a call being generated
    call: str | None = None  # the id of that call
    step_rewards: list[float] = field(default_factory=list)

    def describe(self) -> dict:
        return {
            "id": self.id,
            "env": self.env,
            "task_id": self.task_id,
            "group": self.group_key,
            "status": self.status,
            "turns": len(self.turn_spans),
            "tokens": len(self.token_ids),
            "sampled_tokens": sum(self.loss_mask),
            "weights_versions": sorted(set(self.versions)),
            "mismatch": self.mismatch,
            "truncated": self.truncated,
            "reward": sum(self.step_rewards) if self.status == "closed" else None,
            "trainable": self.status == "closed" and self.mismatch is None and bool(self.turn_spans),
        }


def split_token(token: str) -> tuple[str, str]:
    episode_id, _, secret = token.partition(".")
    return episode_id, secret


def token_of(header: str | None, user: str | None) -> str | None:
    """The episode token a chat call carries: the ``X-Episode-Token`` header, else a ``user`` of the form
    ``episode:<token>``; None for a call outside any episode."""
    if header:
        return header.strip()
    if user and user.startswith(TOKEN_PREFIX):
        return user.removeprefix(TOKEN_PREFIX).strip()
    return None


class EpisodeBook:
    """The open and closed episodes of one endpoint, and the rules above (see the module docstring).

    Args:
        source: the served model (name, directory or adapter directory) whose tokenizer renders prompts.
        config: ``serve.episodes``.
        max_prompt_tokens: the longest prompt a call may have (``serve.max_prompt_tokens``).
        clock: seconds, for expiry (tests pass their own).
    """

    def __init__(self, source: str, config: EpisodesConfig, max_prompt_tokens: int, clock=time.monotonic) -> None:
        self.chat = ChatFormat(load_tokenizer(policy_source(source)[0]))
        self.config = config
        self.max_prompt_tokens = max_prompt_tokens
        self.clock = clock
        self.episodes: dict[str, Episode] = {}
        self.counters = {key: 0 for key in ("opened", "closed", "expired", "mismatched", "harvested", "refused")}

    # ----------------------------------------------------------------------------- opening and looking up

    def open(self, env: str, task_id: int, group: str | None, client: str) -> dict | Refusal:
        """Open an episode for ``client`` (who it is, for ``max_open_per_client``)."""
        self.expire()
        held = sum(e.client == client and e.status == "open" for e in self.episodes.values())
        if held >= self.config.max_open_per_client:
            return self._refuse(
                429,
                f"this client already holds {held} open episodes, the most one client may "
                "(serve.episodes.max_open_per_client); post their rewards or let them expire first",
                "too_many_episodes_for_client",
            )
        if len(self.episodes) >= self.config.max_open:
            return self._refuse(
                429,
                f"{len(self.episodes)} episodes are open, the most this endpoint keeps (serve.episodes.max_open); "
                "close or let some expire first",
                "too_many_episodes",
            )
        now = self.clock()
        episode_id = f"ep-{secrets.token_hex(8)}"
        episode = Episode(
            id=episode_id,
            secret=secrets.token_urlsafe(24),
            env=env,
            task_id=task_id,
            group_key=group if group is not None else episode_id,
            opened=now,
            last_active=now,
            client=client,
        )
        self.episodes[episode_id] = episode
        self.counters["opened"] += 1
        return {**episode.describe(), "token": f"{episode.id}.{episode.secret}", "ttl_s": self.config.ttl_s}

    def find(self, token: str) -> Episode | Refusal:
        """The episode ``token`` names, if its secret is right and it has not expired."""
        found = self._lookup(token)
        if isinstance(found, Refusal):
            self.counters["refused"] += 1
        return found

    def describe(self, token: str) -> dict | Refusal:
        """The episode's state. A missing episode's 404 is an answer here, not a refused request, so it is not
        counted in ``refused``: a client that polls until its finished episodes are gone (taken for training) asks
        often. A wrong secret is counted."""
        found = self._lookup(token)
        if isinstance(found, Refusal):
            self.counters["refused"] += found.code != "episode_not_found"
            return found
        return found.describe()

    # ----------------------------------------------------------------------------- calls

    def prepare(
        self, token: str, messages: list[dict[str, str]], max_new_tokens: int, *, call: str
    ) -> Prepared | Refusal:
        """Admit one chat call of an episode, ``call`` naming it: the prompt ids to generate from (the recorded
        ids and the new message's continuation), or the client's own rendering when the history no longer
        matches (then nothing is held for the call)."""
        found = self.find(token)
        if isinstance(found, Refusal):
            return found
        episode = found
        if episode.status != "open":
            return self._refuse(409, f"episode {episode.id!r} is closed; open a new one", "episode_closed")
        if episode.pending is not None:
            return self._refuse(
                409, f"episode {episode.id!r} has a call in progress; wait for its reply", "episode_busy"
            )
        episode.last_active = self.clock()
        if not episode.turn_spans:
            if any(m["role"] == "assistant" for m in messages):
                return self._refuse(
                    409,
                    "an episode's first call opens the conversation: it holds no assistant message",
                    "invalid_episode_call",
                    "messages",
                )
            ids = self.chat.prompt_ids(messages)
            if refusal := self._over_budget(episode, len(ids), max_new_tokens):
                return refusal
            episode.opening = list(messages)
            episode.messages = list(messages)
            episode.token_ids, episode.loss_mask, episode.logprobs = list(ids), [0] * len(ids), [0.0] * len(ids)
            episode.prompt_length = len(ids)
            episode.pending, episode.call = [], call
            return Prepared(prompt_ids=list(ids), recorded=True)
        known = episode.messages
        new = messages[len(known) :]
        if len(new) != 1 or new[0]["role"] != "user":
            return self._refuse(
                409,
                f"each call of an episode repeats the conversation so far ({len(known)} messages) and adds one user "
                f"message; this one has {len(messages)} messages, ending with {[m['role'] for m in new]}",
                "invalid_episode_call",
                "messages",
            )
        changed = self._first_change(known, messages)
        if changed is not None or episode.mismatch is not None:
            if changed is not None and episode.mismatch is None:
                episode.mismatch = changed
                self.counters["mismatched"] += 1
            # Served from the client's own text; nothing of it is recorded.
            ids = self.chat.prompt_ids(messages)
            if len(ids) > self.max_prompt_tokens:
                return self._refuse(400, self._budget_message(len(ids), 0), "context_length_exceeded", "messages")
            return Prepared(prompt_ids=ids, recorded=False)
        last_start, last_end = episode.turn_spans[-1]
        continuation = self.chat.continuation_ids(episode.token_ids[last_start:last_end], new[0]["content"])
        if refusal := self._over_budget(episode, len(episode.token_ids) + len(continuation), max_new_tokens):
            return refusal
        episode.pending, episode.call = continuation, call
        episode.messages = [*known, new[0]]
        return Prepared(prompt_ids=episode.token_ids + continuation, recorded=True)

    def record(
        self,
        token: str,
        token_ids: list[int],
        logprobs: list[float],
        version: int,
        capped: bool,
        text: str,
        *,
        call: str,
    ) -> dict | Refusal:
        """Keep the reply sampled for ``call``, the call in progress: its ids exactly as sampled, and ``text``,
        the reply as the client got it (what its next call must repeat)."""
        found = self.find(token)
        if isinstance(found, Refusal):
            return found
        episode = found
        if episode.pending is None or episode.call != call:
            return self._refuse(409, f"episode {episode.id!r} has no such call in progress", "episode_not_busy")
        continuation, episode.pending, episode.call = episode.pending, None, None
        episode.token_ids += continuation
        episode.loss_mask += [0] * len(continuation)
        episode.logprobs += [0.0] * len(continuation)
        start = len(episode.token_ids)
        episode.token_ids += token_ids
        episode.loss_mask += [1] * len(token_ids)
        episode.logprobs += logprobs
        episode.turn_spans.append((start, len(episode.token_ids)))
        episode.replies.append(text)
        episode.messages.append({"role": "assistant", "content": text})
        episode.turn_capped.append(capped)
        episode.versions.append(version)
        episode.last_active = self.clock()
        return episode.describe()

    def abandon(self, token: str, *, call: str) -> None:
        """Forget ``call`` if it is the call in progress (it ended without a reply); the episode is then as it
        was before it. Anything else (no such call, another call, no episode) is left alone."""
        found = self._lookup(token)
        if isinstance(found, Episode) and found.pending is not None and found.call == call:
            if not found.turn_spans:  # the opening call: nothing was recorded before it
                found.opening, found.messages, found.token_ids, found.loss_mask, found.logprobs = [], [], [], [], []
                found.prompt_length = 0
            elif found.messages and found.messages[-1]["role"] == "user":
                found.messages.pop()
            found.pending, found.call = None, None

    # ----------------------------------------------------------------------------- closing

    def close(self, token: str, reward: float | None, rewards: list[float] | None) -> dict | Refusal:
        """Close an episode with one outcome reward (on its last turn) or one reward per turn."""
        found = self.find(token)
        if isinstance(found, Refusal):
            return found
        episode = found
        if episode.status == "closed":
            return self._refuse(409, f"episode {episode.id!r} already has its reward", "episode_closed")
        if episode.pending is not None:
            return self._refuse(
                409, f"episode {episode.id!r} has a call in progress; post the reward after its reply", "episode_busy"
            )
        if (reward is None) == (rewards is None):
            return self._refuse(400, "give either reward (one outcome) or rewards (one per turn)", "invalid_reward")
        turns = len(episode.turn_spans)
        if rewards is not None and len(rewards) != turns:
            return self._refuse(
                409,
                f"rewards has {len(rewards)} values for {turns} turns; give one per turn",
                "invalid_reward",
                "rewards",
            )
        values = rewards if rewards is not None else [0.0] * (turns - 1) + [reward] if turns else [reward]
        low, high = self.config.reward_range
        outside = [value for value in values if not low <= value <= high]
        if outside:
            return self._refuse(
                400,
                f"reward {outside[0]} is outside this endpoint's range [{low:g}, {high:g}] (serve.episodes.reward_range)",
                "invalid_reward",
                "rewards" if rewards is not None else "reward",
            )
        episode.step_rewards = [float(value) for value in values]
        episode.status = "closed"
        episode.last_active = self.clock()
        self.counters["closed"] += 1
        return episode.describe()

    # ----------------------------------------------------------------------------- training side

    def harvest(self) -> list[tuple[str, Trajectory]]:
        """Take the closed episodes out of the book: ``(group key, trajectory)`` for each that can train (a
        mismatched or empty one is dropped and counted)."""
        taken = []
        for episode in [e for e in self.episodes.values() if e.status == "closed"]:
            del self.episodes[episode.id]
            if episode.mismatch is None and episode.turn_spans:
                taken.append((episode.group_key, self.trajectory(episode)))
                self.counters["harvested"] += 1
        return taken

    def trajectory(self, episode: Episode) -> Trajectory:
        return Trajectory(
            env=episode.env,
            task_id=episode.task_id,
            group=0,  # the trainer numbers groups per iteration
            token_ids=episode.token_ids,
            loss_mask=episode.loss_mask,
            logprobs=episode.logprobs,
            prompt_length=episode.prompt_length,
            turn_spans=episode.turn_spans,
            messages=list(episode.messages),
            actions=episode.replies,
            step_rewards=episode.step_rewards,
            turn_capped=episode.turn_capped,
            reward=float(sum(episode.step_rewards)),
            success=sum(episode.step_rewards) > 0,
            done=not episode.truncated,
            truncated=episode.truncated,
            truncation_reason="context" if episode.truncated else None,
            horizon=len(episode.turn_spans),
            weights_version=min(episode.versions),
        )

    def expire(self) -> int:
        """Drop episodes idle for longer than ``ttl_s``; returns how many."""
        limit = self.clock() - self.config.ttl_s
        stale = [key for key, episode in self.episodes.items() if episode.last_active < limit]
        for key in stale:
            del self.episodes[key]
        self.counters["expired"] += len(stale)
        return len(stale)

    def stats(self) -> dict[str, int]:
        return {**self.counters, "open": sum(e.status == "open" for e in self.episodes.values())}

    # ----------------------------------------------------------------------------- helpers

    def _lookup(self, token: str) -> Episode | Refusal:
        self.expire()
        episode_id, secret = split_token(token)
        episode = self.episodes.get(episode_id)
        if episode is None:
            return Refusal(
                404,
                f"no episode {episode_id!r} here: never opened, expired after {self.config.ttl_s:g} s idle "
                "(serve.episodes.ttl_s), or already used for training",
                "episode_not_found",
            )
        if not hmac.compare_digest(secret.encode(), episode.secret.encode()):
            return Refusal(403, f"wrong secret for episode {episode_id!r}", "episode_forbidden")
        return episode

    def _refuse(self, status: int, message: str, code: str, param: str | None = None) -> Refusal:
        self.counters["refused"] += 1
        return Refusal(status, message, code, param)

    def _budget_message(self, prompt: int, new_tokens: int) -> str:
        return (
            f"the episode's next prompt is {prompt} tokens (+{new_tokens} to generate); this endpoint's "
            f"max_prompt_tokens is {self.max_prompt_tokens}"
        )

    def _over_budget(self, episode: Episode, prompt: int, max_new_tokens: int) -> Refusal | None:
        """A refusal when the prompt leaves no room for the reply; the episode is then marked truncated."""
        if prompt + max_new_tokens <= self.max_prompt_tokens:
            return None
        episode.truncated = True
        return self._refuse(400, self._budget_message(prompt, max_new_tokens), "context_length_exceeded", "messages")

    @staticmethod
    def _first_change(known: list[dict[str, str]], messages: list[dict[str, str]]) -> str | None:
        """Where ``messages`` stops repeating the recorded conversation ``known``, said in words; None if it does."""
        turn = 0
        for index, (want, got) in enumerate(zip(known, messages, strict=False)):
            turn += want["role"] == "assistant"
            if (want["role"], want["content"]) != (got.get("role"), got.get("content")):
                what = f"turn {turn}'s assistant reply" if want["role"] == "assistant" else f"message {index}"
                return f"{what} differs from what this episode recorded (the client changed it)"
        return None

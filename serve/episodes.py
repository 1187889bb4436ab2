"""Episodes recorded on the endpoint: an agent written in any framework plays through ordinary chat calls,
and the endpoint keeps the token ids it sampled, never re-tokenized from text.

A client opens an episode (``POST /v1/episodes``) and gets its id and a token (``<id>.<secret>``) that tags
its chat calls (the ``X-Episode-Token`` header, or ``user: "episode:<token>"``) and closes it with a reward.
The book below builds each call's prompt ids itself, with a :class:`~agentgym_rl.actors.tool_formats.ToolChat`
(the served model's tokenizer and ``model.tool_format`` / ``model.tool_template``):

- The first call's messages (no assistant or tool message among them) and its ``tools`` are rendered as the
  episode's opening; those tools are the episode's functions.
- Every later call must repeat the conversation so far and add either one user message or the ``tool``
  messages answering the last reply's calls (one per call, each naming a call's id as the endpoint returned
  it), which one user message may follow (an Anthropic user turn of ``tool_result`` blocks and text). The recorded ids stand for that history, and only the new turn is rendered, as the turn's
  continuation (``ToolChat.continuation_ids``: a user message, or the format's turn of call results in the
  calls' order), so the ids trained on are the ids sampled. The history is never rendered again.
- The conversation so far is compared message by message with what the book recorded. A reply is recorded
  as the client got it: its content and its parsed calls. A client's echo of it is the same reply when its
  content is the same (none and empty alike) and each call is the same function with the same parsed
  arguments (``ToolCall.same_call``: a client that re-serialized the arguments with other spacing or key
  order echoes the same call) under the id the endpoint returned. Ids are compared too: a ``tool`` message
  names the call it answers by id, so a client that renamed an id could not say which recorded call a
  result answers.
- A call whose history does not continue the recorded one (a reply, call, message or set of tools the client
  changed, or messages it dropped: an agent that compacted its context, rewrote or restarted it) is a
  rewrite. With ``serve.episodes.on_rewrite: segment`` (the default) it begins a new :class:`Segment` of the
  episode: its messages and tools, rendered, are the segment's opening, and its turns are recorded
  token-exact as always. Each segment trains as a trajectory of the episode; the reward reaches each
  (``segment_rewards``), and group statistics count the episode once (``Trajectory.segment``). With
  ``mismatch`` the call is still served (from the client's own rendering of its history) but the episode is
  marked and never trains.

A call is admitted under an id its route chose (``prepare``), and only that id records its reply or gives it
up (``record``, ``abandon``): a route releases the episode on every way out of the call, even one that left
before it learned whether the book admitted it, and never releases another call's.

Each client (``client_of`` in ``serve.routes``: its bearer key and address) holds at most
``serve.episodes.max_open_per_client`` open episodes, so one client's flood is refused to that client alone.

Closing posts one outcome reward or one per turn (over all the episode's turns). An episode idle for
``serve.episodes.ttl_s`` expires and is dropped. Closed episodes that did not mismatch become ``Trajectory``
records with the samplers' layout, one per segment (their ``messages`` the plain rendering of what the model
saw, ``ToolFormat.plain_messages``). The book
lives in one Ray actor (``serve.deployment.episode_store``) that every replica of the endpoint asks, so the
calls of one episode may reach any replica.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from agentgym_rl.actors.adapters import policy_source
from agentgym_rl.actors.chat import ChatFormat
from agentgym_rl.actors.model_store import load_tokenizer
from agentgym_rl.actors.tool_formats import Message, ToolChat, ToolFormatError, ToolTemplate
from agentgym_rl.actors.tool_formats import tool_format as find_tool_format
from agentgym_rl.actors.trajectory import Trajectory
from agentgym_rl.configs.schema import EpisodesConfig
from agentgym_rl.envs.tools import Function, ToolCall

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
class Segment:
    """A stretch of an episode recorded token-exact: the messages and tools of the call that began it, rendered
    once (its opening), then each reply's ids as sampled and each later turn's continuation. An episode has one
    segment, and one more each time its client rewrote its history (``serve.episodes.on_rewrite: segment``)."""

    began_at_turn: int  # the episode's turns recorded before it
    reason: str | None  # how the call that began it rewrote the history (None for the episode's first)
    functions: list[Function]  # the tools of that call
    messages: list[Message]  # the conversation so far, as the client sees it
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    prompt_length: int
    turn_spans: list[tuple[int, int]] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)
    turn_capped: list[bool] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)

    def describe(self) -> dict:
        return {
            "began_at_turn": self.began_at_turn,
            "turns": len(self.turn_spans),
            "tokens": len(self.token_ids),
            "reason": self.reason,
        }


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
    segments: list[Segment] = field(default_factory=list)  # the last is the one being recorded
    status: Literal["open", "closed"] = "open"
    mismatch: str | None = None
    truncated: bool = False
    pending: list[int] | None = None  # the continuation ids of a call being generated
    pending_messages: list[Message] = field(default_factory=list)  # the messages that call adds
    pending_segment: Segment | None = None  # the segment that call begins, kept once its reply is recorded
    call: str | None = None  # the id of that call
    step_rewards: list[float] = field(default_factory=list)

    @property
    def turns(self) -> int:
        return sum(len(segment.turn_spans) for segment in self.segments)

    def describe(self) -> dict:
        return {
            "id": self.id,
            "env": self.env,
            "task_id": self.task_id,
            "group": self.group_key,
            "status": self.status,
            "turns": self.turns,
            "tokens": sum(len(segment.token_ids) for segment in self.segments),
            "sampled_tokens": sum(sum(segment.loss_mask) for segment in self.segments),
            "weights_versions": sorted({v for segment in self.segments for v in segment.versions}),
            "segments": [segment.describe() for segment in self.segments],
            "mismatch": self.mismatch,
            "truncated": self.truncated,
            "reward": sum(self.step_rewards) if self.status == "closed" else None,
            "trainable": self.status == "closed" and self.mismatch is None and bool(self.segments),
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
        tool_format: how calls are written in text (``model.tool_format``).
        tool_template: what renders an opening with tools (``model.tool_template``).
    """

    def __init__(
        self,
        source: str,
        config: EpisodesConfig,
        max_prompt_tokens: int,
        clock=time.monotonic,
        *,
        tool_format: str = "hermes",
        tool_template: ToolTemplate = "auto",
    ) -> None:
        self.chat = ToolChat(
            ChatFormat(load_tokenizer(policy_source(source)[0])), find_tool_format(tool_format), tool_template
        )
        self.config = config
        self.max_prompt_tokens = max_prompt_tokens
        self.clock = clock
        self.episodes: dict[str, Episode] = {}
        self.counters = {
            key: 0 for key in ("opened", "closed", "expired", "mismatched", "segmented", "harvested", "refused")
        }

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
        self,
        token: str,
        messages: list[Message],
        max_new_tokens: int,
        *,
        call: str,
        functions: Sequence[Function] = (),
        prefix_ids: Sequence[int] = (),
    ) -> Prepared | Refusal:
        """Admit one chat call of an episode, ``call`` naming it: the prompt ids to generate from (the recorded
        ids and the new turn's continuation), or the client's own rendering when the history no longer matches
        (then nothing is held for the call).

        Args:
            token: the episode's token.
            messages: the call's messages in the shared form (see ``actors.tool_formats``).
            max_new_tokens: the most the reply may sample (the prompt must leave room for it).
            call: the call's id, chosen by the route.
            functions: the call's ``tools``; the first call's are the episode's.
            prefix_ids: ids the reply is made to start with (a forced ``tool_choice``): they follow the prompt,
                are recorded before the sampled reply and are never trained on.
        """
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
        if not episode.segments:
            if any(m["role"] in ("assistant", "tool") for m in messages):
                return self._refuse(
                    409,
                    "an episode's first call opens the conversation: it holds no assistant or tool message",
                    "invalid_episode_call",
                    "messages",
                )
            return self._begin_segment(episode, messages, max_new_tokens, call, functions, prefix_ids, None)
        if episode.mismatch is not None:  # nothing more of it is recorded
            return self._client_rendering(messages, functions, prefix_ids)
        segment = episode.segments[-1]
        known = segment.messages
        rewrite = self._rewrite(known, messages) or self._tools_change(segment.functions, list(functions))
        if rewrite is not None and self.config.on_rewrite == "segment":
            self.counters["segmented"] += 1
            return self._begin_segment(episode, messages, max_new_tokens, call, functions, prefix_ids, rewrite)
        if rewrite is not None:
            episode.mismatch = rewrite
            self.counters["mismatched"] += 1
            return self._client_rendering(messages, functions, prefix_ids)
        new = messages[len(known) :]
        roles = [m["role"] for m in new]
        results = len(roles) - (roles[-1:] == ["user"])  # the tool messages before a last user message
        if roles != ["user"] and not (results and all(role == "tool" for role in roles[:results])):
            return self._refuse(
                409,
                f"each call of an episode repeats the conversation so far ({len(known)} messages) and adds one user "
                f"message, or the tool messages answering the last reply's calls (then at most one user message); "
                f"this one has {len(messages)} messages, ending with {roles}",
                "invalid_episode_call",
                "messages",
            )
        if roles[0] == "tool":
            answered = self._answered_calls(known[-1].get("tool_calls") or [], new[:results])
            if isinstance(answered, Refusal):
                return answered
            new = answered + new[results:]
        last_start, last_end = segment.turn_spans[-1]
        continuation = self.chat.continuation_ids(segment.token_ids[last_start:last_end], new) + list(prefix_ids)
        if refusal := self._over_budget(episode, len(segment.token_ids) + len(continuation), max_new_tokens):
            return refusal
        episode.pending, episode.call = continuation, call
        episode.pending_messages = [self._kept(m) for m in messages[len(known) :]]
        return Prepared(prompt_ids=segment.token_ids + continuation, recorded=True)

    def _client_rendering(
        self, messages: list[Message], functions: Sequence[Function], prefix_ids: Sequence[int]
    ) -> Prepared | Refusal:
        """A call of a mismatched episode, served from the client's own history rendered whole; nothing of it is
        recorded."""
        try:
            ids = self.chat.prompt_ids(messages, functions) + list(prefix_ids)
        except ToolFormatError as exc:
            return self._refuse(400, str(exc), "invalid_episode_call", "messages")
        if len(ids) > self.max_prompt_tokens:
            return self._refuse(400, self._budget_message(len(ids), 0), "context_length_exceeded", "messages")
        return Prepared(prompt_ids=ids, recorded=False)

    def _begin_segment(
        self,
        episode: Episode,
        messages: list[Message],
        max_new_tokens: int,
        call: str,
        functions: Sequence[Function],
        prefix_ids: Sequence[int],
        reason: str | None,
    ) -> Prepared | Refusal:
        """A call whose messages and tools, rendered, are the opening of a new segment (the episode's first, or
        one after a rewritten history, ``reason`` saying how). The segment is kept once the call's reply is
        recorded; until then the episode's recorded segments are as they were."""
        if messages[-1]["role"] not in ("user", "tool"):
            return self._refuse(
                409,
                f"a call of an episode ends with a user message or tool results, not {messages[-1]['role']!r} "
                "(a prefilled reply cannot be recorded as sampled)",
                "invalid_episode_call",
                "messages",
            )
        try:
            opening = self.chat.prompt_ids(messages, functions)
        except ToolFormatError as exc:
            return self._refuse(400, str(exc), "invalid_episode_call", "messages")
        ids = opening + list(prefix_ids)
        if refusal := self._over_budget(episode, len(ids), max_new_tokens):
            return refusal
        kept = [self._kept(m) for m in messages]
        episode.pending_segment = Segment(
            began_at_turn=episode.turns,
            reason=reason,
            functions=list(functions),
            messages=[],
            token_ids=list(opening),
            loss_mask=[0] * len(opening),
            logprobs=[0.0] * len(opening),
            prompt_length=len(ids),
        )
        episode.pending, episode.call, episode.pending_messages = list(prefix_ids), call, kept
        return Prepared(prompt_ids=ids, recorded=True)

    def record(
        self,
        token: str,
        token_ids: list[int],
        logprobs: list[float],
        version: int,
        capped: bool,
        text: str | None,
        *,
        call: str,
        tool_calls: Sequence[ToolCall] | None = None,
    ) -> dict | Refusal:
        """Keep the reply sampled for ``call``, the call in progress: its ids exactly as sampled, and the reply as
        the client got it (what its next call must repeat): ``text``, its content (None beside calls and no
        text), and ``tool_calls``, its parsed calls with the ids the endpoint returned."""
        found = self.find(token)
        if isinstance(found, Refusal):
            return found
        episode = found
        if episode.pending is None or episode.call != call:
            return self._refuse(409, f"episode {episode.id!r} has no such call in progress", "episode_not_busy")
        continuation, episode.pending, episode.call = episode.pending, None, None
        if episode.pending_segment is not None:
            episode.segments.append(episode.pending_segment)
            episode.pending_segment = None
        segment = episode.segments[-1]
        segment.token_ids += continuation
        segment.loss_mask += [0] * len(continuation)
        segment.logprobs += [0.0] * len(continuation)
        start = len(segment.token_ids)
        segment.token_ids += token_ids
        segment.loss_mask += [1] * len(token_ids)
        segment.logprobs += logprobs
        segment.turn_spans.append((start, len(segment.token_ids)))
        calls = list(tool_calls or [])
        segment.replies.append(self.chat.format.call_text(text, calls) if calls else text or "")
        reply: Message = {"role": "assistant", "content": text if calls else text or ""}
        if calls:
            reply["tool_calls"] = calls
        segment.messages += [*episode.pending_messages, reply]
        episode.pending_messages = []
        segment.turn_capped.append(capped)
        segment.versions.append(version)
        episode.last_active = self.clock()
        return episode.describe()

    def abandon(self, token: str, *, call: str) -> None:
        """Forget ``call`` if it is the call in progress (it ended without a reply); the episode is then as it
        was before it. Anything else (no such call, another call, no episode) is left alone."""
        found = self._lookup(token)
        if isinstance(found, Episode) and found.pending is not None and found.call == call:
            found.pending, found.pending_messages, found.pending_segment, found.call = None, [], None, None

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
        turns = episode.turns
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
        """Take the closed episodes out of the book: ``(group key, trajectory)`` for each segment of each that can
        train, an episode's segments one after another, in order (a mismatched or empty one is dropped and
        counted)."""
        taken = []
        for episode in [e for e in self.episodes.values() if e.status == "closed"]:
            del self.episodes[episode.id]
            if episode.mismatch is None and episode.segments:
                taken += [(episode.group_key, trajectory) for trajectory in self.trajectories(episode)]
                self.counters["harvested"] += 1
        return taken

    def trajectories(self, episode: Episode) -> list[Trajectory]:
        """One trajectory per segment of a closed episode: its step rewards those :func:`segment_rewards` gives it,
        its ``reward`` the episode's outcome. All carry the episode's oldest weights version, so staleness drops
        an episode whole."""
        lengths = [len(segment.turn_spans) for segment in episode.segments]
        oldest = min(v for segment in episode.segments for v in segment.versions)
        outcome = float(sum(episode.step_rewards))
        last = len(episode.segments) - 1
        return [
            Trajectory(
                env=episode.env,
                task_id=episode.task_id,
                group=0,  # the trainer numbers groups per iteration
                segment=index,
                token_ids=segment.token_ids,
                loss_mask=segment.loss_mask,
                logprobs=segment.logprobs,
                prompt_length=segment.prompt_length,
                turn_spans=segment.turn_spans,
                messages=self.chat.format.plain_messages(segment.messages, segment.functions),
                actions=segment.replies,
                step_rewards=rewards,
                turn_capped=segment.turn_capped,
                reward=outcome,
                success=outcome > 0,
                # an earlier segment ends where the client rewrote its history, never at a limit
                done=index < last or not episode.truncated,
                truncated=index == last and episode.truncated,
                truncation_reason="context" if index == last and episode.truncated else None,
                horizon=len(segment.turn_spans),
                weights_version=oldest,
            )
            for index, (segment, rewards) in enumerate(
                zip(episode.segments, segment_rewards(episode.step_rewards, lengths), strict=True)
            )
        ]

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

    def _answered_calls(self, calls: list[ToolCall], results: list[Message]) -> list[Message] | Refusal:
        """``results`` (tool messages) in the order of ``calls``, the last reply's, when they answer each once."""
        made = [c.id for c in calls]
        if not made:
            return self._refuse(
                409,
                "the episode's last reply made no tool calls; a call of the episode adds one user message after it",
                "invalid_episode_call",
                "messages",
            )
        named = [m.get("tool_call_id") for m in results]
        unknown = [name for name in named if name not in made]
        if unknown:
            return self._refuse(
                409,
                f"a tool message answers call id {unknown[0]!r}, which the episode's last reply did not make; its "
                f"calls are {made} (answer them by the ids the endpoint returned)",
                "invalid_episode_call",
                "messages",
            )
        if sorted(named) != sorted(made):
            return self._refuse(
                409,
                f"the tool messages answer calls {named}; answer each call of the last reply once: {made}",
                "invalid_episode_call",
                "messages",
            )
        return sorted(results, key=lambda m: made.index(m["tool_call_id"]))

    @staticmethod
    def _kept(message: Message) -> Message:
        """The parts of a message the book compares and renders."""
        return {k: v for k, v in message.items() if k in ("role", "content", "tool_calls", "tool_call_id")}

    @staticmethod
    def _tools_change(opened: list[Function], given: list[Function]) -> str | None:
        """How a later call's tools differ from the episode's (its first call's), in words; None if they do not."""
        if given == opened:
            return None
        names, before = [f.name for f in given], [f.name for f in opened]
        if names == before:
            return f"the tools {names} differ in their descriptions or schemas from the episode's first call's"
        return (
            f"the tools {names} differ from the episode's first call's {before} (the tools an episode offers are fixed)"
        )

    @classmethod
    def _rewrite(cls, known: list[Message], messages: list[Message]) -> str | None:
        """How ``messages`` fails to continue the recorded conversation ``known``, in words: a recorded message
        changed, or dropped; None when it repeats all of it."""
        changed = cls._first_change(known, messages)
        if changed is None and len(messages) < len(known):
            dropped = len(known) - len(messages)
            return f"the history has {len(messages)} messages, the last {dropped} of the {len(known)} recorded dropped"
        return changed

    @staticmethod
    def _first_change(known: list[Message], messages: list[Message]) -> str | None:
        """Where ``messages`` stops repeating the recorded conversation ``known``, said in words; None if it does."""
        turn = 0
        for index, (want, got) in enumerate(zip(known, messages, strict=False)):
            turn += want["role"] == "assistant"
            what = f"turn {turn}'s assistant reply" if want["role"] == "assistant" else f"message {index}"
            difference = _difference(want, got)
            if difference is not None:
                return f"{what} differs from what this episode recorded (the client changed {difference})"
        return None


def segment_rewards(step_rewards: Sequence[float], lengths: Sequence[int]) -> list[list[float]]:
    """The step rewards of each segment of an episode: its own turns' rewards, the last of them also carrying
    every later turn's (undiscounted), so a segment's return from any of its turns is the episode's return from
    that turn, and an outcome reward on the episode's last turn reaches every segment whole.

    Args:
        step_rewards: one reward per turn of the episode.
        lengths: the turns of each segment, in order (they sum to ``len(step_rewards)``).
    """
    assert sum(lengths) == len(step_rewards), (lengths, len(step_rewards))
    split, start = [], 0
    for length in lengths:
        own = [float(value) for value in step_rewards[start : start + length]]
        start += length
        own[-1] += float(sum(step_rewards[start:]))
        split.append(own)
    return split


def _difference(want: Message, got: Message) -> str | None:
    """What a client changed in a recorded message ``want`` (its echo ``got``), in words; None for nothing."""
    if want["role"] != got.get("role"):
        return "its role"
    if want["role"] == "assistant":
        if (want.get("content") or "") != (got.get("content") or ""):
            return "its text"
        made: list[ToolCall] = want.get("tool_calls") or []
        echoed: list[Any] = got.get("tool_calls") or []
        if len(made) != len(echoed):
            return f"its calls: {len(echoed)} where the reply made {len(made)}"
        for number, (a, b) in enumerate(zip(made, echoed, strict=True), start=1):
            if not a.same_call(b):
                return f"call {number}'s function or arguments: {b.name} {b.arguments} for {a.name} {a.arguments}"
            if a.id != b.id:
                return f"call {number}'s id: {b.id!r} where the endpoint returned {a.id!r}"
        return None
    if want["role"] == "tool" and want.get("tool_call_id") != got.get("tool_call_id"):
        return "the call id it answers"
    if want.get("content") != got.get("content"):
        return "its text"
    return None

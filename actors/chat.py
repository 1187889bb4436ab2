"""Token-exact multi-turn conversations for any prefix-stable chat template.

The model's sampled ids are never decoded and re-encoded. What the template writes between an
assistant reply and the next user message's content (and after that content, through the next
generation prompt) is learned once, by rendering probe conversations with marker strings, and
appended as ids after each sampled reply.

Two kinds of instability are found up front, when the :class:`ChatFormat` is built:

* text: adding a turn rewrites earlier text (e.g. the system prompt moves to the last user turn,
  or history replies render differently from a generated one). Turns cannot be appended at all:
  :class:`TemplateError`.
* tokens: the text is appended exactly, but tokenizing the whole rendered conversation splits a
  boundary differently from the turn-by-turn ids (e.g. a generation prompt ending in ``"\\n\\n"`` is
  one token, while ``"\\n\\nAction"`` tokenizes as ``"\\n", "\\n", "Action"``). Episodes stay
  self-consistent (the model is trained on exactly the ids it saw) but differ from the tokenized
  rendering: ``token_exact`` is False, ``token_issue`` says where, and a warning is logged.
"""

from __future__ import annotations

import structlog
from transformers import PreTrainedTokenizerBase

from agentgym_rl.configs.errors import AgentGymError

log = structlog.get_logger()

_SYSTEM, _USER, _REPLY, _NEXT, _REPLY2, _NEXT2 = (
    "\x1esystem-probe\x1e",
    "\x1euser-probe\x1e",
    "\x1ereply-probe\x1e",
    "\x1enext-probe\x1e",
    "\x1esecond-reply-probe\x1e",
    "\x1esecond-next-probe\x1e",
)
# Typical episode contents for the token-level check: replies and observations start with letters.
_PROBE_SYSTEM = "You are an agent in a text world. Reply with one action."
_PROBE_TURNS = (
    ("Your goal: go to the red ball.", "Thought: the ball is ahead.\nAction: go forward"),
    ("You see a wall 2 steps ahead.", "Action: turn left"),
    ("You see a red ball 1 step ahead.", "Action: done"),
)


class TemplateError(AgentGymError, ValueError):
    """The tokenizer's chat template cannot be extended turn by turn (not prefix-stable)."""


class ChatFormat:
    """Renders prompts and turn continuations as token ids for one tokenizer.

    Args:
        tokenizer: a tokenizer with a chat template.

    Attributes:
        turn_separator: text the template writes after a reply, up to the next user message's content.
        user_suffix: text after a user message's content, through the generation prompt.
        token_exact: turn-by-turn ids equal the tokenized rendering of a probe episode.
        token_issue: where they first differ, when they do (None otherwise).

    Raises:
        TemplateError: there is no chat template, it cannot render a system + user + assistant
            conversation, or adding a turn rewrites text rendered before it.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        if not tokenizer.chat_template:
            raise TemplateError(f"tokenizer {tokenizer.name_or_path!r} has no chat template")
        self.tokenizer = tokenizer
        self.turn_separator, self.user_suffix = self._learn_turn_text()
        self.token_issue = self._token_issue()
        self.token_exact = self.token_issue is None
        if self.token_issue is not None:
            log.warning("chat template is not token-exact", tokenizer=tokenizer.name_or_path, issue=self.token_issue)

    def render(self, messages: list[dict[str, str]], *, add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """Ids of the opening messages followed by the assistant generation prompt."""
        return self.encode(self.render(messages, add_generation_prompt=True))

    def decode_reply(self, token_ids: list[int]) -> str:
        """The reply text the environment sees (special tokens removed)."""
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def continuation_ids(self, sampled_ids: list[int], observation: str) -> list[int]:
        """Ids that close the sampled reply and open the next turn with ``observation``.

        When the sampled reply already ends with the special token the template writes after a
        reply (its end-of-turn token), the rest of the separator is added; a reply cut off by the
        token cap or a stop string gets the whole separator.
        """
        separator = self.turn_separator
        last = self.tokenizer.added_tokens_decoder.get(sampled_ids[-1]) if sampled_ids else None
        if last is not None and last.special and separator.startswith(last.content):
            separator = separator[len(last.content) :]
        return self.encode(separator + observation + self.user_suffix)

    def _render_probe(self, messages: list[dict[str, str]]) -> str:
        try:
            return self.render(messages, add_generation_prompt=True)
        except Exception as exc:  # jinja raises from templates (e.g. "System role not supported")
            raise TemplateError(
                f"the chat template of {self.tokenizer.name_or_path!r} cannot render a system + user + assistant "
                f"conversation ({type(exc).__name__}: {exc}); episodes open with the env instruction as a system "
                "message"
            ) from exc

    def _learn_turn_text(self) -> tuple[str, str]:
        """The separator and user suffix, checked to be the same for the second and third turn."""
        opening = [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": _USER}]
        two = [*opening, {"role": "assistant", "content": _REPLY}, {"role": "user", "content": _NEXT}]
        three = [*two, {"role": "assistant", "content": _REPLY2}, {"role": "user", "content": _NEXT2}]
        prompt, extended, longer = (self._render_probe(m) for m in (opening, two, three))
        head = prompt + _REPLY
        if not extended.startswith(head) or _NEXT not in extended[len(head) :]:
            raise TemplateError(
                f"the chat template of {self.tokenizer.name_or_path!r} is not prefix-stable: the prompt followed by "
                "the reply is not how the template renders that reply once a user turn follows (it rewrites earlier "
                "text), so turns cannot be appended token-exactly"
            )
        separator, _, user_suffix = extended[len(head) :].partition(_NEXT)
        if longer != extended + _REPLY2 + separator + _NEXT2 + user_suffix:
            raise TemplateError(
                f"the chat template of {self.tokenizer.name_or_path!r} is not prefix-stable: a third turn rewrites "
                "the text of the first two or is framed differently from the second, so turns cannot be appended "
                "token-exactly"
            )
        return separator, user_suffix

    def _token_issue(self) -> str | None:
        """Play a probe episode turn by turn (as ``run_episode`` does) and compare its ids with the
        tokenized rendering after each reply and each continuation; describe the first difference."""
        eos = self.tokenizer.eos_token
        # The model ends a reply with the end-of-turn token when the template closes replies with it.
        closes_with_eos = bool(eos) and self.turn_separator.startswith(eos)
        messages = [{"role": "system", "content": _PROBE_SYSTEM}, {"role": "user", "content": _PROBE_TURNS[0][0]}]
        ids = self.prompt_ids(messages)
        for turn, (_, reply) in enumerate(_PROBE_TURNS):
            sampled = self.encode(reply) + ([self.tokenizer.eos_token_id] if closes_with_eos else [])
            ids = ids + sampled
            messages.append({"role": "assistant", "content": reply})
            rendered = self.encode(self.render(messages, add_generation_prompt=False))
            issue = self._first_difference(ids, rendered[: len(ids)], f"after reply {turn + 1}")
            if issue is not None or turn + 1 == len(_PROBE_TURNS):
                return issue
            observation = _PROBE_TURNS[turn + 1][0]
            ids = ids + self.continuation_ids(sampled, observation)
            messages.append({"role": "user", "content": observation})
            issue = self._first_difference(ids, self.prompt_ids(messages), f"after observation {turn + 2}")
            if issue is not None:
                return issue
        return None

    def _first_difference(self, episode: list[int], rendered: list[int], where: str) -> str | None:
        if episode == rendered:
            return None
        pairs = enumerate(zip(episode, rendered, strict=False))  # they may differ in length too
        at = next((i for i, (a, b) in pairs if a != b), min(len(episode), len(rendered)))

        def show(ids: list[int]) -> str:
            return repr([self.tokenizer.decode([i], skip_special_tokens=False) for i in ids[at : at + 3]])

        return (
            f"{where}, token {at}: the turn-by-turn ids continue {show(episode)} but the tokenized rendering "
            f"continues {show(rendered)}; episodes keep the ids the model saw, which differ from re-tokenizing "
            "their text at this boundary"
        )

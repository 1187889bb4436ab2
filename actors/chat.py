"""Token-exact multi-turn conversations for any prefix-stable chat template.

The model's sampled ids are never decoded and re-encoded. What the template puts around an
assistant reply and a following user message is learned once, by rendering a probe conversation
with marker strings, and appended as ids after each sampled reply.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

_SYSTEM, _USER, _REPLY, _NEXT = (
    "\x1esystem-probe\x1e",
    "\x1euser-probe\x1e",
    "\x1ereply-probe\x1e",
    "\x1enext-probe\x1e",
)


class TemplateError(ValueError):
    """The tokenizer's chat template cannot be extended turn by turn (not prefix-stable)."""


class ChatFormat:
    """Renders prompts and turn continuations as token ids for one tokenizer.

    Args:
        tokenizer: a tokenizer with a chat template.

    Raises:
        TemplateError: the template has no chat template, or rendering a conversation with one
            more message does not extend the rendering without it.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        if not tokenizer.chat_template:
            raise TemplateError(f"tokenizer {tokenizer.name_or_path!r} has no chat template")
        self.tokenizer = tokenizer
        base = [
            {"role": "system", "content": _SYSTEM},
            {"role": "user", "content": _USER},
            {"role": "assistant", "content": _REPLY},
        ]
        closed = self.render(base, add_generation_prompt=False)
        extended = self.render([*base, {"role": "user", "content": _NEXT}], add_generation_prompt=True)
        if not extended.startswith(closed) or _REPLY not in closed:
            raise TemplateError(
                f"the chat template of {tokenizer.name_or_path!r} is not prefix-stable: adding a user turn "
                "rewrites earlier text, so turns cannot be appended token-exactly"
            )
        # Text the template writes after an assistant reply (e.g. "<|im_end|>\n").
        self.reply_suffix = closed[closed.index(_REPLY) + len(_REPLY) :]
        # Text of the next user message around its content, through the generation prompt.
        user_text = extended[len(closed) :]
        self.user_prefix, _, self.user_suffix = user_text.partition(_NEXT)

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

        When the sampled reply already ends with the template's end-of-turn token, only the rest of
        the reply suffix is added; a reply cut off by the token cap gets the whole suffix.
        """
        suffix = self.reply_suffix
        if sampled_ids:
            last = self.tokenizer.decode(sampled_ids[-1:], skip_special_tokens=False)
            if last and suffix.startswith(last):
                suffix = suffix[len(last) :]
        return self.encode(suffix + self.user_prefix + observation + self.user_suffix)

"""From sampled ids to what a client reads: reply text with stop strings cut (streamed in safe pieces),
and the text and bytes of single tokens for ``logprobs``."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable

from transformers import PreTrainedTokenizerBase


class ReplyText:
    """The text of one choice as its tokens arrive, with OpenAI's ``stop`` semantics.

    The text ends just before the first stop string, which is not returned (the engine stops on the
    token that completes it and keeps that token, so the cut happens here). While streaming, a tail
    that could still grow into a stop string is held back until later tokens decide, and so is a
    token that ends inside a multi-byte character; :meth:`finish` releases the rest.

    Args:
        decode: ids -> reply text (special tokens left out).
        stops: the request's stop strings.
    """

    def __init__(self, decode: Callable[[list[int]], str], stops: Iterable[str]) -> None:
        self.decode = decode
        self.stops = tuple(stops)
        self.longest = max((len(s) for s in self.stops), default=0)
        self.ids: list[int] = []
        self.sent = 0  # characters already handed out

    def push(self, token_ids: Iterable[int]) -> str:
        """Add sampled ids; returns the new text that is now safe to send (maybe empty)."""
        self.ids.extend(token_ids)
        text = self._cut(self.decode(self.ids))
        end = len(text.rstrip("\ufffd"))
        for size in range(min(self.longest - 1, end), 0, -1):
            if any(stop.startswith(text[end - size : end]) for stop in self.stops):
                end -= size
                break
        return self._emit(text[:end])

    def finish(self) -> str:
        """The text not sent yet, once the choice has finished."""
        return self._emit(self._cut(self.decode(self.ids)))

    @property
    def text(self) -> str:
        """The whole reply text so far, cut before a stop string."""
        return self._cut(self.decode(self.ids))

    def stop_hit(self) -> str | None:
        """The stop string the reply ended on (the first one in its text), or None."""
        text = self.decode(self.ids)
        hits = [(at, stop) for stop in self.stops if (at := text.find(stop)) >= 0]
        return min(hits)[1] if hits else None

    def _cut(self, text: str) -> str:
        hits = [at for at in (text.find(stop) for stop in self.stops) if at >= 0]
        return text[: min(hits)] if hits else text

    def _emit(self, text: str) -> str:
        delta = text[self.sent :]
        self.sent = max(self.sent, len(text))
        return delta


@functools.cache
def _byte_of_char() -> dict[str, int]:
    """Inverse of the byte-to-character table of byte-level BPE vocabularies (GPT-2's ``bytes_to_unicode``)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + extra)] = byte
            extra += 1
    return chars


class TokenTexts:
    """Text and UTF-8 bytes of single tokens, as OpenAI's ``logprobs`` entries show them.

    For byte-level BPE vocabularies (GPT-2, Llama-3, SmolLM2) the bytes are the token's own, also for a
    token that holds part of a multi-byte character; otherwise they are its decoded text's bytes.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self.byte_level = type(getattr(backend, "decoder", None)).__name__ == "ByteLevel"

    @functools.lru_cache(maxsize=65536)  # noqa: B019 -- one instance per ingress, alive as long as the app
    def entry(self, token_id: int) -> tuple[str, list[int]]:
        """(text, bytes) of ``token_id``."""
        piece = self.tokenizer.convert_ids_to_tokens(token_id)
        table = _byte_of_char()
        if self.byte_level and piece and all(c in table for c in piece):
            raw = bytes(table[c] for c in piece)
        else:
            raw = self.tokenizer.decode([token_id]).encode()
        return raw.decode("utf-8", errors="replace"), list(raw)

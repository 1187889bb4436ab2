"""Reply text as clients read it: stop strings cut (never streamed in part), multi-byte characters whole."""

from __future__ import annotations

import pytest

from agentgym_rl.serve.text import ReplyText, TokenTexts


def pieces(decode, token_groups, stops):
    reply = ReplyText(decode, stops)
    streamed = [reply.push(group) for group in token_groups]
    return streamed, reply.finish(), reply.text


def char_decode(ids: list[int]) -> str:
    """A toy tokenizer: each id is one character."""
    return "".join(chr(i) for i in ids)


@pytest.mark.parametrize(
    ("text", "stops", "expected"),
    [
        ("hello world", [], "hello world"),
        ("hello world", ["o w"], "hell"),
        ("hello world", ["xyz", "wor"], "hello "),
        ("hello world", ["ld", "lo"], "hel"),  # the earliest stop wins
        ("hello world", ["world!"], "hello world"),  # a stop never completed holds nothing back at the end
    ],
)
def test_text_ends_before_the_first_stop_and_no_part_of_a_stop_is_ever_streamed(text, stops, expected):
    streamed, rest, whole = pieces(char_decode, [[ord(c)] for c in text], stops)
    assert "".join(streamed) + rest == expected == whole
    for index in range(len(streamed)):
        sent = "".join(streamed[: index + 1])
        assert expected.startswith(sent)  # never more than the final text, never a stop's beginning beyond it


def test_a_token_ending_inside_a_multibyte_character_waits_for_the_rest(tokenizer):
    ids = tokenizer.encode("ok 你好")
    streamed, rest, whole = pieces(lambda i: tokenizer.decode(i, skip_special_tokens=True), [[i] for i in ids], [])
    assert "\ufffd" not in "".join(streamed)
    assert "".join(streamed) + rest == "ok 你好" == whole


def test_token_texts_give_each_token_its_own_bytes(tokenizer):
    texts = TokenTexts(tokenizer)
    ids = tokenizer.encode("héllo 你好")
    raw = b"".join(bytes(texts.entry(i)[1]) for i in ids)
    assert raw.decode() == "héllo 你好"  # tokens holding half a character still carry their exact bytes
    assert texts.entry(tokenizer.encode(" world")[0]) == (" world", list(b" world"))

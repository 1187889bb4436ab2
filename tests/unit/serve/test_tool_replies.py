"""Sampled replies read as OpenAI's tool calls: whole, and streamed (content up to a call's opening, calls at the
end), with the forced prefix of a compulsory or named call."""

from __future__ import annotations

import pytest

from agentgym_rl.actors.tool_formats import HermesFormat
from agentgym_rl.serve.text import ReplyText
from agentgym_rl.serve.tool_replies import ToolReplyText, ToolUse, argument_pieces, tool_reply

HERMES = HermesFormat()
MOVE = '<tool_call>\n{"name": "move", "arguments": {"direction": "left"}}\n</tool_call>'
LOOK = '<tool_call>\n{"name": "look", "arguments": {}}\n</tool_call>'
MALFORMED = '<tool_call>\n{"name": "move", "arguments": {"direction": }\n</tool_call>'


def calls(reply) -> list[tuple[str, dict]]:
    return [(call.name, call.arguments) for call in reply.calls]


def test_one_call_parallel_calls_text_around_them_and_no_call():
    one = tool_reply(HERMES, MOVE, "stop")
    assert one.finish_reason == "tool_calls" and one.content is None and one.error is None
    assert calls(one) == [("move", {"direction": "left"})]
    both = tool_reply(HERMES, f"First I look.\n{LOOK}\n{MOVE}\nThen I move.", "stop")
    assert calls(both) == [("look", {}), ("move", {"direction": "left"})]
    assert both.content == "First I look.\n\n\nThen I move."  # the text between and after the calls, as written
    assert len({call.id for call in both.calls}) == 2 and all(c.id.startswith("call_") for c in both.calls)
    assert calls(tool_reply(HERMES, f"{LOOK}{MOVE}", "stop", parallel=False)) == [("look", {})]
    text = tool_reply(HERMES, "I go left.", "length")
    assert (text.content, text.calls, text.finish_reason, text.error) == ("I go left.", [], "length", None)


def test_a_call_that_does_not_parse_is_the_whole_text_with_its_own_finish_reason():
    reply = tool_reply(HERMES, f"Moving. {MALFORMED}", "stop")
    assert reply.content == f"Moving. {MALFORMED}" and reply.calls == [] and reply.finish_reason == "stop"
    assert "not JSON" in reply.error


def test_forced_prefixes_start_the_call_the_model_completes():
    assert HERMES.call_prefix() == "<tool_call>"
    named = HERMES.call_prefix("move")
    assert named == '<tool_call>\n{"name": "move", "arguments": '
    assert calls(tool_reply(HERMES, named + '{"direction": "left"}}\n</tool_call>', "stop")) == [
        ("move", {"direction": "left"})
    ]


def char_decode(ids: list[int]) -> str:
    return "".join(chr(i) for i in ids)


def stream(text: str, use: ToolUse, piece: int = 3, stops: tuple[str, ...] = ()) -> tuple[list[str], str, object]:
    reader = ToolReplyText(ReplyText(char_decode, stops), HERMES, use)
    ids = [ord(c) for c in text]
    sent = [reader.push(ids[at : at + piece]) for at in range(0, len(ids), piece)]
    rest, reply = reader.finish("stop")
    return sent, rest, reply


@pytest.mark.parametrize("piece", [1, 4, 1000])
def test_streamed_content_stops_at_a_calls_opening_and_the_calls_equal_the_whole_replys(piece):
    text = f"Looking.\n{LOOK}\n{MOVE}"
    sent, rest, reply = stream(text, ToolUse(parse=True), piece)
    assert "".join(sent) == "Looking." and rest == ""  # the whole reply's content
    assert calls(reply) == calls(tool_reply(HERMES, text, "stop")) and reply.finish_reason == "tool_calls"


def test_text_after_the_calls_follows_once_the_choice_ends_and_a_failed_call_streams_as_text():
    for text in (f"Hi {LOOK} bye", f"Hi {LOOK}", f"Hi\n{LOOK}\n{MOVE}\n"):
        sent, rest, reply = stream(text, ToolUse(parse=True))
        assert "".join(sent) + rest == tool_reply(HERMES, text, "stop").content == reply.content, text
    assert calls(reply) == [("look", {}), ("move", {"direction": "left"})]
    sent, rest, reply = stream(MALFORMED, ToolUse(parse=True))
    assert "".join(sent) + rest == MALFORMED and reply.error is not None and reply.finish_reason == "stop"
    sent, rest, _ = stream("a <tool but no call", ToolUse(parse=True), piece=1)
    assert "".join(sent) + rest == "a <tool but no call"


def test_a_forced_prefix_is_read_with_the_sampled_text_and_never_streamed_as_content():
    use = ToolUse(parse=True, prefix=HERMES.call_prefix("move"))
    sent, rest, reply = stream('{"direction": "left"}}\n</tool_call>', use)
    assert "".join(sent) + rest == "" and calls(reply) == [("move", {"direction": "left"})]
    sent, rest, reply = stream("oops", use)  # the model broke the call: the prefix comes back as text with it
    assert "".join(sent) + rest == use.prefix + "oops" and reply.error is not None


def test_arguments_stream_in_pieces_that_join_to_the_json_string():
    [call] = tool_reply(HERMES, MOVE.replace("left", "left" * 20), "stop").calls
    pieces = argument_pieces(call)
    assert len(pieces) > 1 and "".join(pieces) == call.arguments_json()

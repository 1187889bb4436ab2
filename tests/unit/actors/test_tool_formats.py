"""Tool-call formats: parsing hand-written replies, the built-in rendering, and token-exact tool turns."""

import copy

import pytest

from agentgym_rl.actors.chat import ChatFormat, TemplateError
from agentgym_rl.actors.model_store import load_tokenizer
from agentgym_rl.actors.tool_formats import (
    HermesFormat,
    ToolChat,
    ToolFormatError,
    register_tool_format,
    tool_format,
)
from agentgym_rl.envs.tools import Function, ToolCall

HERMES = HermesFormat()
MOVE = Function(
    name="move",
    description="Walk.",
    parameters={"type": "object", "properties": {"steps": {"type": "integer"}}, "required": ["steps"]},
)
LOOK = Function(name="look", description="Look around.")


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        ("I will walk.", "I will walk.", []),
        ('<tool_call>\n{"name": "move", "arguments": {"steps": 2}}\n</tool_call>', None, [("move", {"steps": 2})]),
        (  # parallel calls, text before and between them
            (
                'Two things.\n<tool_call>{"name": "look", "arguments": {}}</tool_call>\n'
                '<tool_call>{"name": "move", "arguments": {"steps": 1}}</tool_call>'
            ),
            "Two things.",
            [("look", {}), ("move", {"steps": 1})],
        ),
        (  # text after the call; arguments as a JSON string (as OpenAI sends them)
            '<tool_call>{"name": "move", "arguments": "{\\"steps\\": 3}"}</tool_call> then done',
            "then done",
            [("move", {"steps": 3})],
        ),
        ('<tool_call>{"name": "look"}', None, [("look", {})]),  # cut by the end of the reply, arguments omitted
    ],
)
def test_hermes_reads_calls_and_the_text_around_them(text, content, calls):
    parsed = HERMES.parse(text)
    assert parsed.error is None
    assert parsed.content == content
    assert [(c.name, c.arguments) for c in parsed.calls] == calls
    assert [c.id for c in parsed.calls] == [f"call_{i}" for i in range(len(calls))]


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ('<tool_call>{"name": "move", "arguments": {"steps": 2</tool_call>', "tool call 1 is not JSON"),
        ('<tool_call>{"arguments": {}}</tool_call>', "tool call 1 has no function name"),
        ('<tool_call>{"name": "look"}</tool_call><tool_call>["move"]</tool_call>', "tool call 2 has no function name"),
        ('<tool_call>{"name": "move", "arguments": [2]}</tool_call>', "tool call 1's arguments are not a JSON object"),
    ],
)
def test_a_call_that_does_not_parse_leaves_the_reply_as_text(text, error):
    parsed = HERMES.parse(text)
    assert parsed.calls == [] and parsed.content == text
    assert parsed.error.startswith(error)


def test_written_calls_parse_back_to_the_same_calls():
    calls = [ToolCall(id="a", name="move", arguments={"steps": 2}), ToolCall(id="b", name="look", arguments={})]
    parsed = HERMES.parse(HERMES.call_text("Walking, then looking.", calls), call_id=lambda i: "ab"[i])
    assert parsed.calls == calls and parsed.content == "Walking, then looking."


def test_streamed_content_stops_where_a_call_may_begin():
    assert HERMES.content_end("Hello") == 5
    assert HERMES.content_end("Hello <tool") == 6
    assert HERMES.content_end("Hello <tool_call>{") == 6
    assert HERMES.content_end("a < b") == 5


CONVERSATION = [
    {"role": "system", "content": "Play."},
    {"role": "user", "content": "Go."},
    {"role": "assistant", "content": None, "tool_calls": [ToolCall(id="c1", name="look", arguments={})]},
    {"role": "tool", "tool_call_id": "c1", "content": "A wall."},
    {
        "role": "assistant",
        "content": "Turning.",
        "tool_calls": [ToolCall(id="c2", name="move", arguments={"steps": 1})],
    },
    {"role": "tool", "tool_call_id": "c2", "content": "Moved."},
    {"role": "user", "content": "Faster."},
]


def test_the_builtin_rendering_of_tool_messages():
    plain = HERMES.plain_messages(CONVERSATION, [MOVE, LOOK])
    # the results of the second call and the user message after them are one user turn
    assert [m["role"] for m in plain] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert plain[5]["content"] == "<tool_response>\nMoved.\n</tool_response>\nFaster."
    assert plain[0]["content"].startswith("Play.\n\n# Tools") and '"name": "move"' in plain[0]["content"]
    assert plain[2]["content"] == '<tool_call>\n{"name": "look", "arguments": {}}\n</tool_call>'
    assert plain[3]["content"] == "<tool_response>\nA wall.\n</tool_response>"
    assert plain[4]["content"].startswith("Turning.\n<tool_call>")
    no_system = HERMES.plain_messages(CONVERSATION[1:2], [LOOK])
    assert [m["role"] for m in no_system] == ["system", "user"] and no_system[0]["content"].startswith("# Tools")
    with pytest.raises(ToolFormatError, match="message 1 is a tool result that follows no assistant tool call"):
        HERMES.plain_messages([CONVERSATION[1], CONVERSATION[3]], [])


@pytest.fixture(scope="module")
def chat():
    return ChatFormat(load_tokenizer("tiny-random"))


def test_tool_turns_appended_as_ids_equal_the_rendered_conversation(chat):
    tools = ToolChat(chat, HERMES, "builtin")
    eos = [chat.tokenizer.eos_token_id]
    ids = tools.prompt_ids(CONVERSATION[:2], [MOVE, LOOK])
    first = chat.encode(HERMES.call_text(None, CONVERSATION[2]["tool_calls"])) + eos
    ids += first + tools.continuation_ids(first, CONVERSATION[3:4])
    second = chat.encode(HERMES.call_text("Turning.", CONVERSATION[4]["tool_calls"])) + eos
    ids += second + tools.continuation_ids(second, CONVERSATION[5:6])
    assert ids == tools.prompt_ids(CONVERSATION[:6], [MOVE, LOOK])
    # results and a user message in one call: one turn, as the whole conversation renders it
    with_text = ids[: -len(tools.continuation_ids(second, CONVERSATION[5:6]))] + tools.continuation_ids(
        second, CONVERSATION[5:7]
    )
    assert with_text == tools.prompt_ids(CONVERSATION, [MOVE, LOOK])
    with pytest.raises(ToolFormatError, match=r"not \['user', 'user'\]"):
        tools.continuation_ids(second, [CONVERSATION[6], CONVERSATION[6]])


# A ChatML template that renders tools in the hermes style, as Qwen's do (its own wording of the tool list).
HERMES_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'system' -%}{{ '<|im_start|>system\\n' + m.content }}"
    "{%- if tools -%}{{ '\\n\\nYou may call:\\n<tools>' }}{%- for t in tools -%}{{ '\\n' + (t | tojson) }}{%- endfor -%}"
    "{{ '\\n</tools>' }}{%- endif -%}{{ '<|im_end|>\\n' }}"
    "{%- elif m.role == 'assistant' -%}{{ '<|im_start|>assistant\\n' }}{%- if m.content -%}{{ m.content }}{%- endif -%}"
    "{%- for c in m.tool_calls or [] -%}{%- if m.content or not loop.first -%}{{ '\\n' }}{%- endif -%}"
    "{{ '<tool_call>\\n{\"name\": ' + (c.function.name | tojson) + ', \"arguments\": ' + (c.function.arguments | tojson)"
    " + '}\\n</tool_call>' }}{%- endfor -%}{{ '<|im_end|>\\n' }}"
    "{%- elif m.role == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{ '<|im_start|>user\\n' }}"
    "{%- else -%}{{ '\\n' }}{%- endif -%}{{ '<tool_response>\\n' + m.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{ '<|im_end|>\\n' }}{%- endif -%}"
    "{%- else -%}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif -%}"
    "{%- endfor -%}{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)


def chat_with_template(template: str) -> ChatFormat:
    tokenizer = copy.deepcopy(load_tokenizer("tiny-random"))
    tokenizer.chat_template = template
    return ChatFormat(tokenizer)


def test_a_model_template_that_renders_tools_opens_the_episode(chat):
    own = chat_with_template(HERMES_TEMPLATE)
    tools = ToolChat(own, HERMES, "auto")
    assert tools.uses_model_template
    opening = own.tokenizer.decode(tools.prompt_ids(CONVERSATION[:2], [MOVE, LOOK]))
    assert "You may call:\n<tools>" in opening and "# Tools" not in opening
    eos = [own.tokenizer.eos_token_id]
    first = own.encode(HERMES.call_text(None, CONVERSATION[2]["tool_calls"])) + eos
    ids = tools.prompt_ids(CONVERSATION[:2], [MOVE, LOOK]) + first + tools.continuation_ids(first, CONVERSATION[3:4])
    assert ids == tools.prompt_ids(CONVERSATION[:4], [MOVE, LOOK])
    assert not ToolChat(own, HERMES, "builtin").uses_model_template
    assert not ToolChat(chat, HERMES, "auto").uses_model_template  # SmolLM2's ChatML renders no tools
    with pytest.raises(TemplateError, match="renders no tools"):
        ToolChat(chat, HERMES, "model")


def test_a_model_template_that_renders_results_otherwise_is_not_used_turn_by_turn():
    other = chat_with_template(HERMES_TEMPLATE.replace("<tool_response>", "<result>"))
    assert not ToolChat(other, HERMES, "auto").uses_model_template
    with pytest.raises(TemplateError, match="renders a call and its result differently"):
        ToolChat(other, HERMES, "model")


class UpperFormat(HermesFormat):
    """A format registered by a test: hermes with its tags in capitals."""

    name = "upper"
    call_opening = "<TOOL_CALL>"


def test_formats_are_found_by_registered_name_or_path():
    assert isinstance(tool_format("hermes"), HermesFormat)
    with pytest.raises(ToolFormatError, match="unknown tool format 'qwen9'; registered: hermes"):
        tool_format("qwen9")
    register_tool_format("upper", UpperFormat)
    assert isinstance(tool_format("upper"), UpperFormat)
    assert isinstance(tool_format(f"{__name__}:UpperFormat"), UpperFormat)
    with pytest.raises(ToolFormatError, match="not a ToolFormat subclass"):
        tool_format(f"{__name__}:chat_with_template")
    with pytest.raises(ToolFormatError, match="not a subclass of ToolFormat"):
        register_tool_format("bad", dict)

"""The endpoint's episode book: prompt ids built from what was sampled, mismatches caught, bad requests refused."""

from __future__ import annotations

import pytest

from agentgym_rl.actors.chat import ChatFormat
from agentgym_rl.actors.model_store import TINY_RANDOM, load_tokenizer
from agentgym_rl.actors.tool_formats import HermesFormat, ToolChat
from agentgym_rl.configs.schema import EpisodesConfig
from agentgym_rl.envs.tools import Function, ToolCall
from agentgym_rl.serve.episodes import EpisodeBook, Prepared, Refusal, segment_rewards, token_of

OPENING = [{"role": "system", "content": "You play a grid game."}, {"role": "user", "content": "You see a red ball."}]
OBSERVATIONS = ["You moved forward.", "You see a wall."]
CLIENT = "key-digest@127.0.0.1"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def chat():
    return ChatFormat(load_tokenizer(TINY_RANDOM))


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def book(clock):
    return EpisodeBook(TINY_RANDOM, EpisodesConfig(ttl_s=60, max_open=3), max_prompt_tokens=400, clock=clock)


@pytest.fixture
def mismatch_book(clock):
    """A book that marks a rewritten history as a mismatch instead of beginning a segment."""
    config = EpisodesConfig(ttl_s=60, max_open=3, on_rewrite="mismatch")
    return EpisodeBook(TINY_RANDOM, config, max_prompt_tokens=400, clock=clock)


def sampled(chat: ChatFormat, text: str) -> list[int]:
    """Ids as a sampler might have drawn them: the text's tokens one by one, then the stop token (not the ids
    a re-encoding of the reply would give back when the tokenizer merges differently)."""
    ids = [tid for ch in text for tid in chat.tokenizer.encode(ch, add_special_tokens=False)]
    return [*ids, chat.tokenizer.eos_token_id]


def play(book: EpisodeBook, chat: ChatFormat, token: str, replies: list[str]) -> list[dict[str, str]]:
    """Play ``replies`` as a client re-sending its whole history each call; returns the history."""
    messages = list(OPENING)
    for turn, text in enumerate(replies):
        prepared = book.prepare(token, messages, max_new_tokens=16, call=f"call-{turn}")
        assert isinstance(prepared, Prepared) and prepared.recorded, prepared
        ids = sampled(chat, text)
        reply = chat.decode_reply(ids)
        book.record(token, ids, [-0.5] * len(ids), version=3 + turn, capped=False, text=reply, call=f"call-{turn}")
        messages += [
            {"role": "assistant", "content": chat.decode_reply(sampled(chat, text))},
            {"role": "user", "content": OBSERVATIONS[turn]},
        ]
    return messages


def test_a_recorded_episode_trains_on_exactly_the_ids_it_sampled(book, chat):
    token = book.open("babyai", 7, "task-7", CLIENT)["token"]
    replies = ["go forward", "turn left"]
    history = play(book, chat, token, replies)
    assert book.close(token, reward=1.0, rewards=None)["trainable"]
    [(group, trajectory)] = book.harvest()
    assert group == "task-7" and trajectory.task_id == 7 and trajectory.env == "babyai"
    # the layout run_episode builds: opening, reply, continuation, reply; the mask is 1 exactly on the samples
    want = chat.prompt_ids(OPENING)
    spans = []
    for turn, text in enumerate(replies):
        if turn:
            want += chat.continuation_ids(sampled(chat, replies[turn - 1]), OBSERVATIONS[turn - 1])
        spans.append((len(want), len(want) + len(sampled(chat, text))))
        want += sampled(chat, text)
    assert trajectory.token_ids == want
    assert trajectory.turn_spans == spans
    assert [i for i, m in enumerate(trajectory.loss_mask) if m] == [i for a, b in spans for i in range(a, b)]
    assert trajectory.step_rewards == [0.0, 1.0] and trajectory.reward == 1.0 and trajectory.success
    assert trajectory.weights_version == 3 and trajectory.actions == [m["content"] for m in history[2::2]]
    assert book.stats()["harvested"] == 1 and book.episodes == {}


def test_a_changed_reply_is_served_but_marks_the_episode_which_never_trains(mismatch_book, chat):
    book = mismatch_book
    token = book.open("babyai", 1, None, CLIENT)["token"]
    history = play(book, chat, token, ["go forward"])
    history[2] = {"role": "assistant", "content": "pick up the ball"}  # the client rewrote its agent's reply
    prepared = book.prepare(token, history, max_new_tokens=16, call="changed")
    assert isinstance(prepared, Prepared) and not prepared.recorded
    assert prepared.prompt_ids == chat.prompt_ids(history)  # served from the client's own text
    info = book.describe(token)
    assert info["mismatch"] == (
        "turn 1's assistant reply differs from what this episode recorded (the client changed its text)"
    )
    assert book.close(token, reward=1.0, rewards=None)["trainable"] is False
    assert book.harvest() == [] and book.stats()["mismatched"] == 1


@pytest.mark.parametrize(
    ("case", "status", "code"),
    [
        ("unknown episode", 404, "episode_not_found"),
        ("wrong secret", 403, "episode_forbidden"),
        ("reward twice", 409, "episode_closed"),
        ("reward out of range", 400, "invalid_reward"),
        ("rewards per turn of the wrong length", 409, "invalid_reward"),
        ("call while one is in progress", 409, "episode_busy"),
        ("over the context budget", 400, "context_length_exceeded"),
        ("two new messages", 409, "invalid_episode_call"),
        ("expired", 404, "episode_not_found"),
        ("too many open", 429, "too_many_episodes"),
    ],
)
def test_bad_requests_are_refused_naming_the_problem_and_lose_nothing(case, status, code, book, chat, clock):
    token = book.open("babyai", 2, None, CLIENT)["token"]
    history = play(book, chat, token, ["go forward"])
    before = book.describe(token)
    episode_id, _, _ = token.partition(".")
    match case:
        case "unknown episode":
            refusal = book.prepare("ep-0000.nothing", history, 16, call="c")
        case "wrong secret":
            refusal = book.close(f"{episode_id}.not-the-secret", 1.0, None)
        case "reward twice":
            book.close(token, 1.0, None)
            refusal = book.close(token, 0.0, None)
            before = book.describe(token)
        case "reward out of range":
            refusal = book.close(token, 11.0, None)
        case "rewards per turn of the wrong length":
            refusal = book.close(token, None, [0.0, 1.0])
        case "call while one is in progress":
            assert isinstance(book.prepare(token, history, 16, call="first"), Prepared)
            refusal = book.prepare(token, history, 16, call="second")
            book.abandon(token, call="first")
        case "over the context budget":
            refusal = book.prepare(token, history, 400, call="c")
            before = {**before, "truncated": True}
        case "two new messages":
            refusal = book.prepare(token, [*history, {"role": "user", "content": "and again"}], 16, call="c")
        case "expired":
            clock.now += 61
            refusal = book.prepare(token, history, 16, call="c")
        case "too many open":
            book.open("babyai", 3, None, CLIENT), book.open("babyai", 4, None, CLIENT)
            refusal = book.open("babyai", 5, None, CLIENT)
    assert isinstance(refusal, Refusal) and (refusal.status, refusal.code) == (status, code), refusal
    assert refusal.message
    if case != "expired":
        assert book.describe(token) == before  # the episode is as it was
    else:
        assert book.stats()["expired"] == 1


def test_a_call_tags_its_episode_by_header_or_user_field():
    assert token_of("ep-1.s", None) == "ep-1.s"
    assert token_of(None, "episode:ep-1.s") == "ep-1.s"
    assert token_of(None, "someone") is None and token_of(None, None) is None


def test_a_lookup_of_a_gone_episode_answers_404_without_counting_as_refused(book, chat):
    token = book.open("babyai", 7, None, CLIENT)["token"]
    play(book, chat, token, ["go forward"])
    book.close(token, reward=1.0, rewards=None)
    book.harvest()  # taken for training: a paced client now polls until it is gone
    gone = book.describe(token)
    assert isinstance(gone, Refusal) and (gone.status, gone.code) == (404, "episode_not_found")
    assert book.stats()["refused"] == 0
    assert isinstance(book.prepare(token, OPENING, 16, call="c"), Refusal)  # a call on it is a refused request
    forbidden = book.describe(f"{book.open('babyai', 8, None, CLIENT)['id']}.not-the-secret")
    assert isinstance(forbidden, Refusal) and forbidden.status == 403
    assert book.stats()["refused"] == 2


def test_only_the_call_in_progress_records_or_gives_itself_up(book, chat):
    token = book.open("babyai", 9, None, CLIENT)["token"]
    history = play(book, chat, token, ["go forward"])
    before = book.describe(token)
    assert isinstance(book.prepare(token, history, 16, call="held"), Prepared)
    book.abandon(token, call="another")  # e.g. a call the book refused as busy, released on its way out
    refused = book.record(token, [5, 6], [-1.0, -1.0], version=3, capped=False, text="x", call="another")
    assert isinstance(refused, Refusal) and refused.code == "episode_not_busy"
    book.abandon(token, call="held")
    assert book.describe(token) == before
    book.abandon(token, call="held")  # twice, or after the reply was recorded: nothing happens
    assert isinstance(book.prepare(token, history, 16, call="next"), Prepared)


def test_one_client_at_its_bound_is_refused_while_another_still_opens(clock):
    config = EpisodesConfig(max_open=10, max_open_per_client=2)
    book = EpisodeBook(TINY_RANDOM, config, max_prompt_tokens=400, clock=clock)
    first = [book.open("babyai", task, None, "flood@10.0.0.1") for task in range(2)]
    refusal = book.open("babyai", 2, None, "flood@10.0.0.1")
    assert isinstance(refusal, Refusal) and (refusal.status, refusal.code) == (429, "too_many_episodes_for_client")
    assert "max_open_per_client" in refusal.message
    assert "token" in book.open("babyai", 3, None, "other@10.0.0.2")
    book.close(first[0]["token"], reward=1.0, rewards=None)  # a closed episode no longer counts as open
    assert "token" in book.open("babyai", 4, None, "flood@10.0.0.1")


# ----------------------------------------------------------------------------- tool calls

FUNCTIONS = [
    Function(name="move_forward", description="Move one step forward."),
    Function(
        name="pickup",
        description="Pick up an object.",
        parameters={
            "type": "object",
            "properties": {"object": {"type": "string"}, "color": {"type": "string"}},
            "required": ["object"],
        },
    ),
]
BALL = {"object": "ball", "color": "red"}


@pytest.fixture(scope="module")
def tools(chat):
    return ToolChat(chat, HermesFormat(), "builtin")


@pytest.fixture
def tool_book(clock):
    """A book whose prompts have room for the functions' descriptions."""
    return EpisodeBook(TINY_RANDOM, EpisodesConfig(ttl_s=60), max_prompt_tokens=1000, clock=clock)


@pytest.fixture
def mismatch_tool_book(clock):
    config = EpisodesConfig(ttl_s=60, on_rewrite="mismatch")
    return EpisodeBook(TINY_RANDOM, config, max_prompt_tokens=1000, clock=clock)


def reply_with(book: EpisodeBook, chat: ChatFormat, token: str, messages: list[dict], calls: list[ToolCall], turn: int):
    """The model writes ``calls`` (as hermes text, its ids the tokens of that text, as sampled); the book records
    the reply as the endpoint returns it; returns the assistant message a client echoes."""
    prepared = book.prepare(token, messages, max_new_tokens=48, call=f"call-{turn}", functions=FUNCTIONS)
    assert isinstance(prepared, Prepared) and prepared.recorded, prepared
    ids = [*chat.encode(HermesFormat().call_text(None, calls)), chat.tokenizer.eos_token_id]
    book.record(token, ids, [-0.25] * len(ids), 1, False, None, call=f"call-{turn}", tool_calls=calls)
    return {"role": "assistant", "content": None, "tool_calls": calls}


def results(calls: list[ToolCall], *texts: str) -> list[dict]:
    return [{"role": "tool", "tool_call_id": c.id, "content": text} for c, text in zip(calls, texts, strict=True)]


def tool_episode(book: EpisodeBook, chat: ChatFormat) -> tuple[str, list[dict], list[ToolCall]]:
    """An episode of two turns: parallel calls answered by their results, then one call with arguments; returns
    its token, the history a client sends next (ending with the last reply) and the last reply's calls."""
    token = book.open("babyai", 3, "task-3", CLIENT)["token"]
    first = [ToolCall(id="call_a1", name="move_forward"), ToolCall(id="call_a2", name="move_forward")]
    history = [*OPENING, reply_with(book, chat, token, list(OPENING), first, 0)]
    history += results(first, "You moved forward.", "You see a red ball.")
    second = [ToolCall(id="call_b1", name="pickup", arguments=BALL)]
    history.append(reply_with(book, chat, token, history, second, 1))
    return token, history, second


def test_tool_turns_append_ids_equal_to_the_rendering_of_the_whole_conversation(tool_book, chat, tools):
    token, history, last = tool_episode(tool_book, chat)
    history += results(last, "You picked up the ball.")
    prepared = tool_book.prepare(token, history, max_new_tokens=16, call="third", functions=FUNCTIONS)
    assert isinstance(prepared, Prepared) and prepared.recorded
    # the recorded ids and the appended results are how the whole conversation renders: never re-rendered, and
    # still equal to a rendering of it (the template is token-exact at these boundaries)
    assert chat.token_exact and prepared.prompt_ids == tools.prompt_ids(history, FUNCTIONS)
    assert chat.decode_reply(prepared.prompt_ids).count("<tool_response>") == 3
    ids = [*chat.encode("Done."), chat.tokenizer.eos_token_id]
    tool_book.record(token, ids, [-0.5] * len(ids), 2, False, "Done.", call="third")
    assert tool_book.close(token, reward=1.0, rewards=None)["trainable"]
    [(_, trajectory)] = tool_book.harvest()
    assert trajectory.token_ids == prepared.prompt_ids + ids and len(trajectory.turn_spans) == 3
    # the samplers' layout: messages as plain text of what the model saw, actions the replies as written
    assert trajectory.messages == HermesFormat().plain_messages(
        [*history, {"role": "assistant", "content": "Done."}], FUNCTIONS
    )
    assert (
        trajectory.actions[1]
        == '<tool_call>\n{"name": "pickup", "arguments": {"object": "ball", "color": "red"}}\n</tool_call>'
    )
    assert trajectory.actions[2] == "Done."


def test_results_in_another_order_are_appended_in_the_calls_order(tool_book, chat, tools):
    token = tool_book.open("babyai", 3, None, CLIENT)["token"]
    calls = [ToolCall(id="call_1", name="move_forward"), ToolCall(id="call_2", name="pickup", arguments=BALL)]
    history = [*OPENING, reply_with(tool_book, chat, token, list(OPENING), calls, 0)]
    answers = results(calls, "moved", "picked")
    prepared = tool_book.prepare(token, [*history, *answers[::-1]], 16, call="c", functions=FUNCTIONS)
    assert isinstance(prepared, Prepared) and prepared.recorded
    assert prepared.prompt_ids == tools.prompt_ids([*history, *answers], FUNCTIONS)


def test_results_with_a_user_message_in_one_call_append_one_turn_as_the_whole_conversation_renders(
    tool_book, chat, tools
):
    # an Anthropic user turn of tool_result blocks and text
    token, history, last = tool_episode(tool_book, chat)
    history += [*results(last, "You picked up the ball."), {"role": "user", "content": "Now find the door."}]
    prepared = tool_book.prepare(token, history, max_new_tokens=16, call="third", functions=FUNCTIONS)
    assert isinstance(prepared, Prepared) and prepared.recorded
    assert prepared.prompt_ids == tools.prompt_ids(history, FUNCTIONS)
    assert chat.decode_reply(prepared.prompt_ids).endswith("</tool_response>\nNow find the door.\nassistant\n")
    two_users = [*history, {"role": "user", "content": "And again."}]
    tool_book.abandon(token, call="third")
    refusal = tool_book.prepare(token, two_users, 16, call="fourth", functions=FUNCTIONS)
    assert isinstance(refusal, Refusal) and refusal.status == 409 and "at most one user message" in refusal.message


def test_a_client_that_re_serialized_the_arguments_echoes_the_same_call(tool_book, chat):
    token, history, last = tool_episode(tool_book, chat)
    # what arrives after a client dumped the arguments with its own key order and spacing, and sent "" content
    echoed = ToolCall.model_validate(
        {"id": "call_b1", "name": "pickup", "arguments": {"color": "red", "object": "ball"}}
    )
    history[-1] = {"role": "assistant", "content": "", "tool_calls": [echoed]}
    prepared = tool_book.prepare(token, [*history, *results(last, "ok")], 16, call="c", functions=FUNCTIONS)
    assert isinstance(prepared, Prepared) and prepared.recorded
    assert tool_book.describe(token)["mismatch"] is None


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"name": "drop"}, "call 1's function or arguments: drop"),
        ({"arguments": {"object": "ball", "color": "blue"}}, "call 1's function or arguments: pickup"),
        ({"id": "call_zz"}, "call 1's id: 'call_zz' where the endpoint returned 'call_b1'"),
    ],
)
def test_a_client_that_changed_a_call_is_served_but_the_episode_never_trains(
    change, reason, mismatch_tool_book, chat, tools
):
    tool_book = mismatch_tool_book
    token, history, last = tool_episode(tool_book, chat)
    edited = last[0].model_copy(update=change)
    history[-1] = {"role": "assistant", "content": None, "tool_calls": [edited]}
    sent = [*history, *results([edited], "ok")]
    prepared = tool_book.prepare(token, sent, 16, call="c", functions=FUNCTIONS)
    assert isinstance(prepared, Prepared) and not prepared.recorded
    assert prepared.prompt_ids == tools.prompt_ids(sent, FUNCTIONS)  # the client's own history, rendered
    mismatch = tool_book.describe(token)["mismatch"]
    assert mismatch.startswith("turn 2's assistant reply differs") and reason in mismatch, mismatch
    # its later calls (the history grows by a reply and its results each time) are served the same way
    later = [*sent, {"role": "assistant", "content": None, "tool_calls": last}, *results(last, "again")]
    served = tool_book.prepare(token, later, 16, call="later", functions=FUNCTIONS)
    assert isinstance(served, Prepared) and served.prompt_ids == tools.prompt_ids(later, FUNCTIONS)
    assert tool_book.close(token, reward=1.0, rewards=None)["trainable"] is False
    assert tool_book.harvest() == [] and tool_book.stats()["mismatched"] == 1


def test_changed_tools_are_a_mismatch(mismatch_tool_book, chat):
    tool_book = mismatch_tool_book
    token, history, last = tool_episode(tool_book, chat)
    fewer = tool_book.prepare(token, [*history, *results(last, "ok")], 16, call="c", functions=FUNCTIONS[:1])
    assert isinstance(fewer, Prepared) and not fewer.recorded
    assert tool_book.describe(token)["mismatch"] == (
        "the tools ['move_forward'] differ from the episode's first call's ['move_forward', 'pickup'] (the tools an "
        "episode offers are fixed)"
    )


@pytest.mark.parametrize(
    ("case", "answers", "said"),
    [
        ("unknown call id", [("call_b9", "ok")], "answers call id 'call_b9', which the episode's last reply did not"),
        ("a call answered twice", [("call_b1", "ok"), ("call_b1", "again")], "answer each call of the last reply"),
    ],
)
def test_tool_messages_that_answer_no_call_of_the_last_reply_are_refused(case, answers, said, tool_book, chat):
    token, history, _ = tool_episode(tool_book, chat)
    before = tool_book.describe(token)
    sent = [*history, *({"role": "tool", "tool_call_id": i, "content": text} for i, text in answers)]
    refusal = tool_book.prepare(token, sent, 16, call="c", functions=FUNCTIONS)
    assert isinstance(refusal, Refusal) and (refusal.status, refusal.code) == (409, "invalid_episode_call")
    assert said in refusal.message, refusal.message
    assert tool_book.describe(token) == before


def test_tool_results_after_a_reply_without_calls_are_refused_and_a_user_message_after_calls_is_kept(tool_book, chat):
    token = tool_book.open("babyai", 2, None, CLIENT)["token"]
    history = play(tool_book, chat, token, ["go forward"])[:-1]
    refusal = tool_book.prepare(token, [*history, *results([ToolCall(id="call_0", name="x")], "r")], 16, call="c")
    assert isinstance(refusal, Refusal) and "made no tool calls" in refusal.message
    token, history, _ = tool_episode(tool_book, chat)
    prepared = tool_book.prepare(
        token, [*history, {"role": "user", "content": "Go on."}], 16, call="c", functions=FUNCTIONS
    )
    assert isinstance(prepared, Prepared) and prepared.recorded


def test_a_forced_prefix_is_recorded_before_the_reply_and_never_trained_on(tool_book, chat):
    token = tool_book.open("babyai", 3, None, CLIENT)["token"]
    prefix = chat.encode("<tool_call>\n")
    prepared = tool_book.prepare(token, list(OPENING), 16, call="c", functions=FUNCTIONS, prefix_ids=prefix)
    assert isinstance(prepared, Prepared) and prepared.prompt_ids[-len(prefix) :] == prefix
    ids = [5, 6, chat.tokenizer.eos_token_id]
    tool_book.record(token, ids, [-1.0] * 3, 1, False, "x", call="c")
    tool_book.close(token, reward=1.0, rewards=None)
    [(_, trajectory)] = tool_book.harvest()
    assert trajectory.token_ids == prepared.prompt_ids + ids and trajectory.prompt_length == len(prepared.prompt_ids)
    assert trajectory.loss_mask == [0] * len(prepared.prompt_ids) + [1] * 3


def reply(book: EpisodeBook, chat: ChatFormat, token: str, messages: list[dict], text: str, call: str, **kw) -> list:
    """Prepare a call of ``messages``, record ``text`` as its sampled reply; returns the prompt ids."""
    prepared = book.prepare(token, messages, max_new_tokens=16, call=call, **kw)
    assert isinstance(prepared, Prepared) and prepared.recorded, prepared
    ids = sampled(chat, text)
    book.record(token, ids, [-0.5] * len(ids), version=1, capped=False, text=chat.decode_reply(ids), call=call)
    return prepared.prompt_ids


def test_a_compacted_history_begins_a_segment_and_each_trains_token_exact(book, chat):
    token = book.open("babyai", 5, "task-5", CLIENT)["token"]
    history = play(book, chat, token, ["go forward", "turn left"])
    # the agent compacts: its history becomes the system prompt and a summary, then it goes on
    summary = [OPENING[0], {"role": "user", "content": "So far: you moved and turned. You see a door."}]
    prompt = reply(book, chat, token, summary, "open door", "compacted")
    assert prompt == chat.prompt_ids(summary)  # the new segment's opening, rendered once
    later = [*summary, {"role": "assistant", "content": chat.decode_reply(sampled(chat, "open door"))}]
    later.append({"role": "user", "content": "The door opens."})
    continued = reply(book, chat, token, later, "go through", "after")
    assert continued == prompt + sampled(chat, "open door") + chat.continuation_ids(
        sampled(chat, "open door"), "The door opens."
    )
    info = book.describe(token)
    assert info["turns"] == 4 and info["mismatch"] is None
    assert [(s["began_at_turn"], s["turns"]) for s in info["segments"]] == [(0, 2), (2, 2)]
    assert info["segments"][0]["reason"] is None
    assert info["segments"][1]["reason"].startswith("message 1 differs from what this episode recorded")
    assert book.close(token, reward=1.0, rewards=None)["trainable"]
    first, second = [trajectory for group, trajectory in book.harvest() if group == "task-5"]
    assert (first.segment, second.segment) == (0, 1)
    assert first.token_ids[: len(chat.prompt_ids(OPENING))] == chat.prompt_ids(OPENING)
    assert first.messages == [*history[:-1]]  # what the model saw in the first segment
    assert second.token_ids == continued + sampled(chat, "go through")
    assert [i for i, m in enumerate(second.loss_mask) if m] == [i for a, b in second.turn_spans for i in range(a, b)]
    # the outcome reaches both segments whole
    assert first.step_rewards == [0.0, 1.0] and second.step_rewards == [0.0, 1.0]
    assert first.reward == second.reward == 1.0 and book.stats()["segmented"] == 1


def test_dropped_turns_and_changed_tools_begin_segments_and_an_abandoned_one_leaves_the_episode_as_it_was(
    tool_book, chat
):
    token, _, _ = tool_episode(tool_book, chat)
    before = tool_book.describe(token)
    restarted = list(OPENING)  # the agent starts its sub-task over
    prepared = tool_book.prepare(token, restarted, 16, call="restart", functions=FUNCTIONS)
    assert isinstance(prepared, Prepared) and prepared.recorded
    tool_book.abandon(token, call="restart")
    assert tool_book.describe(token) == before
    reply(tool_book, chat, token, restarted, "I will look.", "restart", functions=FUNCTIONS)
    reason = tool_book.describe(token)["segments"][1]["reason"]
    assert reason == "the history has 2 messages, the last 4 of the 6 recorded dropped", reason
    again = [*restarted, {"role": "assistant", "content": "I will look."}, {"role": "user", "content": "Go."}]
    reply(tool_book, chat, token, again, "ok", "fewer tools", functions=FUNCTIONS[:1])
    segments = tool_book.describe(token)["segments"]
    assert [s["began_at_turn"] for s in segments] == [0, 2, 3]
    assert "the tools ['move_forward'] differ" in segments[2]["reason"]


def test_per_turn_rewards_reach_each_segment_as_the_episode_return_from_its_turns():
    assert segment_rewards([0.5, 0.0, 0.25, 1.0], [2, 1, 1]) == [[0.5, 1.25], [1.25], [1.0]]
    assert segment_rewards([0.0, 0.0, 1.0], [3]) == [[0.0, 0.0, 1.0]]


def test_a_rewritten_history_with_on_rewrite_mismatch_is_marked_and_never_trains(mismatch_book, chat):
    token = mismatch_book.open("babyai", 5, None, CLIENT)["token"]
    play(mismatch_book, chat, token, ["go forward", "turn left"])
    summary = [OPENING[0], {"role": "user", "content": "So far: you moved and turned."}]
    served = mismatch_book.prepare(token, summary, 16, call="compacted")
    assert isinstance(served, Prepared) and not served.recorded
    assert mismatch_book.describe(token)["mismatch"].startswith("message 1 differs")
    mismatch_book.close(token, reward=1.0, rewards=None)
    assert mismatch_book.harvest() == []


def test_a_segment_cannot_begin_from_a_history_that_ends_with_a_reply(book, chat):
    token = book.open("babyai", 5, None, CLIENT)["token"]
    history = play(book, chat, token, ["go forward"])
    refusal = book.prepare(token, [OPENING[0], {"role": "assistant", "content": "prefilled"}], 16, call="c")
    assert isinstance(refusal, Refusal) and (refusal.status, refusal.code) == (409, "invalid_episode_call")
    assert "ends with a user message or tool results" in refusal.message
    assert isinstance(book.prepare(token, history, 16, call="next"), Prepared)

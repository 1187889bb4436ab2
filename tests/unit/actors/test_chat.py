import pytest

from agentgym_rl.actors.chat import ChatFormat, TemplateError


def test_turn_by_turn_ids_equal_the_rendered_conversation(tokenizer):
    chat = ChatFormat(tokenizer)
    messages = [
        {"role": "system", "content": "You play a game."},
        {"role": "user", "content": "Your goal: go to the red ball"},
    ]
    ids = chat.prompt_ids(messages)
    for reply, observation in [("Action: turn left", "You see a wall."), ("Action: go to red ball 1", "Done?")]:
        sampled = chat.encode(reply) + [tokenizer.eos_token_id]  # as the model would sample it
        ids += sampled
        messages.append({"role": "assistant", "content": reply})
        messages.append({"role": "user", "content": observation})
        ids += chat.continuation_ids(sampled, observation)
    expected = chat.encode(chat.render(messages, add_generation_prompt=True))
    assert ids == expected


def test_reply_cut_by_the_token_cap_gets_the_full_turn_suffix(tokenizer):
    chat = ChatFormat(tokenizer)
    cut = chat.encode("Action: turn")  # no end-of-turn token sampled
    continuation = chat.continuation_ids(cut, "obs")
    assert continuation[0] == tokenizer.eos_token_id
    finished = chat.continuation_ids(cut + [tokenizer.eos_token_id], "obs")
    assert finished == continuation[1:]


def test_template_that_rewrites_history_is_rejected(tokenizer):
    tokenizer = tokenizer.__class__.from_pretrained(tokenizer.name_or_path)
    # Renders only the last message: adding a turn rewrites everything before it.
    tokenizer.chat_template = "{{ messages[-1]['content'] }}{% if add_generation_prompt %}>{% endif %}"
    with pytest.raises(TemplateError, match="not prefix-stable"):
        ChatFormat(tokenizer)


def test_only_a_sampled_special_token_counts_as_the_start_of_the_turn_separator(tokenizer):
    chat = ChatFormat(tokenizer)
    assert chat.turn_separator.startswith("<")
    angle = chat.encode("<")
    assert len(angle) == 1 and angle[0] not in tokenizer.all_special_ids
    # A reply cut right after an ordinary "<" still gets the whole separator (the "<" is its own text).
    continuation = chat.continuation_ids(chat.encode("Action: go") + angle, "obs")
    assert continuation == chat.encode(chat.turn_separator + "obs" + chat.user_suffix)


def test_template_that_frames_each_turn_differently_is_rejected(tokenizer):
    tokenizer = tokenizer.__class__.from_pretrained(tokenizer.name_or_path)
    # Prefix-stable, but the text after reply N carries N: a separator learned once cannot be reused.
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['content'] }}{% if m['role'] == 'assistant' %}{{ '#' ~ loop.index }}"
        "{% endif %}{{ ';' }}{% endfor %}"
    )
    with pytest.raises(TemplateError, match="a third turn"):
        ChatFormat(tokenizer)

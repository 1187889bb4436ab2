"""Token exactness of a 3-turn BabyAI episode under several families' chat templates.

The templates other than the built-in ChatML are written here in each family's format and set on a
copy of the SmolLM2 tokenizer (their markers are plain text to it, which makes tokenization
boundaries harder, not easier).
"""

from __future__ import annotations

import asyncio
import copy

import pytest

from actors.chat import ChatFormat, TemplateError
from actors.engines import Generation, make_engine
from actors.rollout import run_episode
from actors.trajectory import Trajectory
from configs.schema import SamplingConfig
from envs import make

LLAMA3 = (
    "{{ '<|begin_of_text|>' }}{% for m in messages %}"
    "{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' + m['content'] + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
# The system prompt goes into the first [INST] block; [/INST] is the generation prompt.
MISTRAL = (
    "{% if messages[0]['role'] == 'system' %}{% set sys = messages[0]['content'] + '\n\n' %}"
    "{% set msgs = messages[1:] %}{% else %}{% set sys = '' %}{% set msgs = messages %}{% endif %}"
    "{{ '<s>' }}{% for m in msgs %}{% if m['role'] == 'user' %}"
    "{{ '[INST] ' + (sys if loop.first else '') + m['content'] + ' [/INST]' }}"
    "{% else %}{{ m['content'] + '</s>' }}{% endif %}{% endfor %}"
)
QWEN = (
    "{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}"
    "{% endif %}{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
GEMMA = (
    "{% if messages[0]['role'] == 'system' %}{% set sys = messages[0]['content'] + '\n\n' %}"
    "{% set msgs = messages[1:] %}{% else %}{% set sys = '' %}{% set msgs = messages %}{% endif %}"
    "{{ '<bos>' }}{% for m in msgs %}{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' + (sys if loop.first else '') + m['content'] + '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)
# Not prefix-stable: the system prompt rides on the *last* user message, so a new turn moves it.
SYSTEM_ON_LAST_USER = (
    "{% set sys = messages[0]['content'] if messages[0]['role'] == 'system' else '' %}"
    "{% set msgs = messages[1:] if messages[0]['role'] == 'system' else messages %}"
    "{% set ns = namespace(last=-1) %}{% for m in msgs %}{% if m['role'] == 'user' %}"
    "{% set ns.last = loop.index0 %}{% endif %}{% endfor %}"
    "{{ '<s>' }}{% for m in msgs %}{% if m['role'] == 'user' %}"
    "{{ '[INST] ' + (sys + '\n\n' if loop.index0 == ns.last else '') + m['content'] + ' [/INST]' }}"
    "{% else %}{{ m['content'] + '</s>' }}{% endif %}{% endfor %}"
)
TEMPLATES = {"smollm2-chatml": None, "llama3": LLAMA3, "mistral": MISTRAL, "qwen": QWEN, "gemma": GEMMA}


@pytest.fixture(scope="module")
def engine(tokenizer):
    return make_engine(
        "transformers",
        model_name="tiny-random",
        dtype="float32",
        seed=0,
        stop_token_ids=[tokenizer.eos_token_id],
        pad_token_id=tokenizer.pad_token_id,
    )


def with_template(tokenizer, template: str | None):
    if template is None:
        return tokenizer
    copied = copy.deepcopy(tokenizer)
    copied.chat_template = template
    return copied


def play(tokenizer, generate) -> Trajectory:
    """A 3-turn episode on a real BabyAI level with ``generate`` as the policy."""
    env = make("babyai", {"levels": ["GoToObjS6"]})

    async def reset(task_id):
        return env.reset(task_id)

    async def step(text):
        return env.step(text)

    chat = ChatFormat(tokenizer)
    trajectory = asyncio.run(
        run_episode(
            env_name="babyai",
            instruction=env.instruction,
            reset=reset,
            step=step,
            generate=lambda prompt: generate(env, chat, prompt),
            chat=chat,
            task_id=env.tasks("train")[0],
            group=0,
            horizon=3,
            max_new_tokens=8,
            max_context_tokens=8192,
        )
    )
    return trajectory


def reply_closer(tokenizer) -> str:
    """The text the template writes right after an assistant reply, read off a rendering."""
    text = tokenizer.apply_chat_template(
        [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}, {"role": "assistant", "content": "R!"}],
        tokenize=False,
    )
    return text[text.index("R!") + 2 :]


def decode(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


@pytest.mark.parametrize("family", list(TEMPLATES))
def test_sampled_episode_is_the_rendered_conversation_with_replies_kept_as_sampled(tokenizer, engine, family):
    tok = with_template(tokenizer, TEMPLATES[family])

    async def generate(env, chat, prompt):
        return engine.generate([prompt], SamplingConfig(max_new_tokens=8))[0], engine.weights_version

    trajectory = play(tok, generate)
    assert trajectory.num_turns == 3
    ids, eos_text, closer = trajectory.token_ids, tok.eos_token, reply_closer(tok)
    contents = []
    for start, end in trajectory.turn_spans:
        text = decode(tok, ids[start:end])
        # A reply that ended on the end-of-turn token the template itself writes: the token is the template's.
        contents.append(text[: -len(eos_text)] if text.endswith(eos_text) and closer.startswith(eos_text) else text)
    segments, position = [], 0
    for start, end in trajectory.turn_spans:
        segments += [(position, start, False), (start, end, True)]
        position = end
    users = [m["content"] for m in trajectory.messages if m["role"] == "user"]
    for turn in range(trajectory.num_turns):
        messages = [trajectory.messages[0], {"role": "user", "content": users[0]}]
        for j in range(turn):
            messages += [{"role": "assistant", "content": contents[j]}, {"role": "user", "content": users[j + 1]}]
        rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        # The ids the model saw before reply `turn` spell `rendered`; every id the template or the env
        # contributed is the tokenizer's own encoding of its text.
        cursor = 0
        for seg_start, seg_end, sampled in segments[: 2 * turn + 1]:
            chunk = decode(tok, ids[seg_start:seg_end])
            if not sampled:
                assert ids[seg_start:seg_end] == tok(chunk, add_special_tokens=False)["input_ids"]
            assert rendered.startswith(chunk, cursor), (family, turn, chunk, rendered[cursor:])
            cursor += len(chunk)
        assert cursor == len(rendered)


# With the SmolLM2 tokenizer the Llama-3 header's "\n\n" is one token at the end of a generation prompt but
# two ("\n", "\n") when a reply's letters follow it, so re-tokenizing the whole text differs from what the
# model saw there (the episode keeps what it saw; the text is identical). Its own tokenizer merges "\n\n".
WHITESPACE_SPLIT_AT_REPLY = pytest.mark.xfail(
    strict=True, reason="prompt ends in a whitespace run that the full-text tokenization splits"
)


@pytest.mark.parametrize(
    "family", [pytest.param(f, marks=WHITESPACE_SPLIT_AT_REPLY) if f == "llama3" else f for f in TEMPLATES]
)
def test_oracle_episode_ids_equal_the_tokenized_rendering(tokenizer, family):
    tok = with_template(tokenizer, TEMPLATES[family])
    ends_with_eos = reply_closer(tok).startswith(tok.eos_token)

    async def generate(env, chat, prompt):
        ids = chat.encode(f"Action: {env.oracle_action()}") + ([tok.eos_token_id] if ends_with_eos else [])
        return Generation(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop"), 0

    trajectory = play(tok, generate)
    assert trajectory.num_turns >= 1
    last_reply = max(i for i, m in enumerate(trajectory.messages) if m["role"] == "assistant")
    closed = ChatFormat(tok).render(trajectory.messages[: last_reply + 1], add_generation_prompt=False)
    full = tok(closed, add_special_tokens=False)["input_ids"]
    assert closed.startswith(decode(tok, trajectory.token_ids))
    # The episode ends on its last sampled token; the rendering goes on to close that reply.
    assert full[: len(trajectory.token_ids)] == trajectory.token_ids
    assert (
        decode(tok, full[len(trajectory.token_ids) :])
        == reply_closer(tok)[len(tok.eos_token) if ends_with_eos else 0 :]
    )


def test_a_template_that_is_not_prefix_stable_is_reported_before_any_episode(tokenizer):
    with pytest.raises(TemplateError, match="not prefix-stable"):
        ChatFormat(with_template(tokenizer, SYSTEM_ON_LAST_USER))

"""Token exactness of a 3-turn BabyAI episode under every chat template available offline.

Offline there is one shipped template (SmolLM2's ChatML, shared by both built-in models). The others
are written here in each family's published format and set on copies of the SmolLM2 tokenizer, once
with their markers as plain text (which makes tokenization boundaries harder, not easier) and once
with the markers registered as special tokens, as their own tokenizers have them. One more tokenizer
is trained here: a byte-level BPE with Llama-3's pre-tokenizer split, under the Llama-3 template.

For each case, ChatFormat's verdict must match what actually happens: a template it accepts as
``token_exact`` yields episodes equal to the tokenized rendering; one it flags yields an episode that
differs; one it rejects (TemplateError) really rewrites earlier text when a turn is added.
"""

from __future__ import annotations

import asyncio
import copy
import functools

import pytest
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from agentgym_rl.actors.chat import ChatFormat, TemplateError
from agentgym_rl.actors.engines import Generation
from agentgym_rl.actors.rollout import run_episode
from agentgym_rl.actors.trajectory import Trajectory
from agentgym_rl.configs.schema import SamplingConfig
from agentgym_rl.envs import make
from tests.unit.actors.helpers import tiny_engine

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
# Phi-3 closes a finished conversation with the eos token, which a following turn does not keep.
PHI3 = (
    "{% for m in messages %}{{ '<|' + m['role'] + '|>\n' + m['content'] + '<|end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"
)
ZEPHYR = (
    "{% for m in messages %}{{ '<|' + m['role'] + '|>\n' + m['content'] + eos_token + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)
# Llama-2 writes a space before each history reply that the generation prompt does not end with.
LLAMA2 = (
    "{% if messages[0]['role'] == 'system' %}{% set sys = '<<SYS>>\n' + messages[0]['content'] + '\n<</SYS>>\n\n' %}"
    "{% set msgs = messages[1:] %}{% else %}{% set sys = '' %}{% set msgs = messages %}{% endif %}"
    "{% for m in msgs %}{% if m['role'] == 'user' %}"
    "{{ '<s>[INST] ' + (sys if loop.first else '') + m['content'] + ' [/INST]' }}"
    "{% else %}{{ ' ' + m['content'] + ' </s>' }}{% endif %}{% endfor %}"
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

# family -> (template, its marker tokens); None is the tokenizer's own (shipped) template.
TEMPLATES = {
    "smollm2-chatml": (None, []),
    "llama3": (LLAMA3, ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]),
    "mistral": (MISTRAL, ["<s>", "</s>", "[INST]", "[/INST]"]),
    "qwen": (QWEN, []),
    "gemma": (GEMMA, ["<bos>", "<start_of_turn>", "<end_of_turn>"]),
    "phi3": (PHI3, ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]),
    "zephyr": (ZEPHYR, ["<|system|>", "<|user|>", "<|assistant|>"]),
    "llama2": (LLAMA2, ["<s>", "</s>", "[INST]", "[/INST]"]),
    "system-on-last-user": (SYSTEM_ON_LAST_USER, ["<s>", "</s>", "[INST]", "[/INST]"]),
}
# What ChatFormat must conclude, and what the episode must confirm: token-exact, text-exact only
# ("tokens": with the SmolLM2 split, a generation prompt ending in "\n\n" is one token while the
# rendering's "\n\nThought" splits it), or not prefix-stable at all ("text").
EXPECTED = {
    "smollm2-chatml": "exact",
    "llama3": "tokens",
    "llama3+special": "tokens",
    "llama3-bpe": "exact",
    "llama2": "text",
    "llama2+special": "text",
    "system-on-last-user": "text",
    "system-on-last-user+special": "text",
}
CASES = [*TEMPLATES, *(f"{f}+special" for f, (_, markers) in TEMPLATES.items() if markers), "llama3-bpe"]

# Llama-3's pre-tokenizer split (published with its tokenizer): newline runs stay whole.
LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)


@functools.cache
def llama3_style_tokenizer() -> PreTrainedTokenizerFast:
    """A small byte-level BPE with Llama-3's split and special tokens, trained on BabyAI text."""
    env = make("babyai", {"levels": ["GoToObjS6"]})
    corpus = [env.instruction, *(env.reset(task).text for task in env.tasks("train")[:50])]
    corpus += ["Action: go forward\n\n", "Thought: turn left\n\nAction: turn right"] * 20
    specials = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=800, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(corpus, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>", pad_token="<|eot_id|>"
    )
    tokenizer.chat_template = LLAMA3
    return tokenizer


def tokenizer_for(tokenizer, case: str):
    if case == "llama3-bpe":
        return llama3_style_tokenizer()
    family, special = case.removesuffix("+special"), case.endswith("+special")
    template, markers = TEMPLATES[family]
    if template is None:
        return tokenizer
    copied = copy.deepcopy(tokenizer)
    copied.chat_template = template
    if special:
        copied.add_tokens(markers, special_tokens=True)
    return copied


@pytest.fixture(scope="module")
def engine(tokenizer):
    return tiny_engine(tokenizer)


def play(chat: ChatFormat, generate) -> Trajectory:
    """A 3-turn episode on a real BabyAI level with ``generate`` as the policy."""
    env = make("babyai", {"levels": ["GoToObjS6"]})

    async def reset(task_id):
        return env.reset(task_id)

    async def step(text):
        return env.step(text)

    return asyncio.run(
        run_episode(
            env_name="babyai",
            instruction=env.instruction,
            reset=reset,
            step=step,
            generate=lambda prompt: generate(env, prompt),
            chat=chat,
            task_id=env.tasks("train")[0],
            group=0,
            horizon=3,
            max_new_tokens=8,
            max_context_tokens=8192,
        )
    )


def decode(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def rewrites_earlier_text(tok) -> bool:
    """Whether rendering one more reply and user turn changes the text of the conversation before them."""
    opening = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    prompt = tok.apply_chat_template(opening, add_generation_prompt=True, tokenize=False)
    turns = [*opening, {"role": "assistant", "content": "R"}, {"role": "user", "content": "V"}]
    return not tok.apply_chat_template(turns, add_generation_prompt=True, tokenize=False).startswith(prompt + "R")


# Only templates over the model's own vocabulary can be sampled by tiny-random.
@pytest.mark.parametrize("family", [f for f in TEMPLATES if EXPECTED.get(f) != "text"])
def test_sampled_episode_is_the_rendered_conversation_with_replies_kept_as_sampled(tokenizer, engine, family):
    tok = tokenizer_for(tokenizer, family)
    chat = ChatFormat(tok)

    async def generate(env, prompt):
        return engine.generate([prompt], SamplingConfig(max_new_tokens=8))[0], engine.weights_version

    trajectory = play(chat, generate)
    assert trajectory.num_turns == 3
    ids, eos_text = trajectory.token_ids, tok.eos_token
    closes_with_eos = chat.turn_separator.startswith(eos_text)
    contents = []
    for start, end in trajectory.turn_spans:
        text = decode(tok, ids[start:end])
        # A reply that ended on the end-of-turn token the template itself writes: the token is the template's.
        contents.append(text[: -len(eos_text)] if text.endswith(eos_text) and closes_with_eos else text)
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


@pytest.mark.parametrize("case", CASES)
def test_detected_stability_matches_the_oracle_episode_against_the_tokenized_rendering(tokenizer, case):
    tok = tokenizer_for(tokenizer, case)
    expected = EXPECTED.get(case, "exact")
    try:
        chat = ChatFormat(tok)
    except TemplateError as error:
        assert "not prefix-stable" in str(error)
        assert expected == "text" and rewrites_earlier_text(tok)
        return
    assert expected != "text" and not rewrites_earlier_text(tok)
    closes_with_eos = chat.turn_separator.startswith(tok.eos_token)

    async def generate(env, prompt):
        ids = chat.encode(f"Action: {env.oracle_action()}") + ([tok.eos_token_id] if closes_with_eos else [])
        return Generation(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason="stop"), 0

    trajectory = play(chat, generate)
    assert trajectory.num_turns >= 2
    last_reply = max(i for i, m in enumerate(trajectory.messages) if m["role"] == "assistant")
    closed = chat.render(trajectory.messages[: last_reply + 1], add_generation_prompt=False)
    full = tok(closed, add_special_tokens=False)["input_ids"]
    # The text is always exact; the episode ends on its last sampled token, the rendering closes that reply.
    assert closed.startswith(decode(tok, trajectory.token_ids))
    actually_exact = full[: len(trajectory.token_ids)] == trajectory.token_ids
    assert chat.token_exact == actually_exact == (expected == "exact"), chat.token_issue
    if not chat.token_exact:
        assert "tokenized rendering" in chat.token_issue


def test_a_template_that_cannot_render_a_system_message_is_reported(tokenizer):
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
        "{% endif %}{{ m['content'] }}{% endfor %}"
    )
    with pytest.raises(TemplateError, match="System role not supported"):
        ChatFormat(tok)

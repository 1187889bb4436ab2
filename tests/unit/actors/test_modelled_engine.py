"""The modelled engine (a simulation for scale benchmarks): replies an env accepts, seeded, and the GPU time it
models counted as its continuous batch would spend it."""

import asyncio
import math

import pytest

from agentgym_rl.actors.engines import CompletionRequest, SamplingParams, make_engine
from agentgym_rl.actors.engines.modelled import ModelledEngine
from agentgym_rl.actors.model_store import load_tokenizer
from agentgym_rl.configs.schema import ModelledEngineConfig, SamplingConfig
from agentgym_rl.envs.babyai import BabyAIEnv

# Every prompt id costs 1 ms of prefill; a step 10 ms plus 1 ms per row: counts in whole milliseconds.
SETTINGS = ModelledEngineConfig(decode_step_s=0.010, decode_row_s=0.001, prefill_token_s=0.001)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("tiny-random")


def engine(tokenizer, settings: ModelledEngineConfig = SETTINGS) -> ModelledEngine:
    built = make_engine(
        "modelled",
        model_name="tiny-random",
        dtype="float32",
        seed=0,
        stop_token_ids=[tokenizer.eos_token_id],
        pad_token_id=tokenizer.eos_token_id,
        modelled=settings,
    )
    assert isinstance(built, ModelledEngine)
    return built


def request(seed: int, prompt_len: int = 20, key=None, max_new_tokens: int = 200) -> CompletionRequest:
    return CompletionRequest(
        prompt_ids=list(range(1, prompt_len + 1)),
        params=SamplingParams(max_new_tokens=max_new_tokens),
        seed=seed,
        key=key,
    )


def test_replies_are_actions_the_env_accepts_and_end_the_turn(tokenizer):
    modelled = engine(tokenizer)
    serving = modelled.serving(max_rows=8, max_kv_tokens=0, max_requests=64)

    async def play():
        return await asyncio.gather(*(serving.generate(request(seed)) for seed in range(40)))

    env = BabyAIEnv()
    lengths = set()
    for generation, _ in asyncio.run(play()):
        assert generation.finish_reason == "stop"
        assert generation.token_ids[-1] == tokenizer.eos_token_id
        assert len(generation.logprobs) == len(generation.token_ids)
        assert all(lp <= 0.0 for lp in generation.logprobs)
        text = tokenizer.decode(generation.token_ids[:-1])
        assert env.parse_action(text) in ModelledEngineConfig().actions
        lengths.add(len(generation.token_ids))
    assert len(lengths) > 10  # drawn lengths, not one fixed reply


def test_the_same_seed_draws_the_same_reply_and_a_cap_cuts_it(tokenizer):
    a, b = engine(tokenizer), engine(tokenizer)
    sampling = SamplingConfig(max_new_tokens=200)
    first = a.generate([[1, 2, 3]] * 3, sampling, generators=None)
    again = b.generate([[1, 2, 3]] * 3, sampling, generators=None)
    assert [g.token_ids for g in first] == [g.token_ids for g in again]
    cut = a.generate([[1, 2, 3]], SamplingConfig(max_new_tokens=4))[0]
    assert len(cut.token_ids) == 4 and cut.finish_reason == "length"


def test_a_batch_that_joins_together_costs_its_prefill_then_steps_of_the_rows_still_running(tokenizer):
    modelled = engine(tokenizer)
    serving = modelled.serving(max_rows=8, max_kv_tokens=0, max_requests=64)

    async def play():
        return await asyncio.gather(*(serving.generate(request(seed, prompt_len=20)) for seed in range(4)))

    lengths = sorted(len(g.token_ids) for g, _ in asyncio.run(play()))
    # All four join before the first step: 80 prompt ids, then each stretch of steps runs the rows still going.
    expected_ms, done = 80 * 1.0, 0
    for i, length in enumerate(lengths):
        expected_ms += (length - done) * (10 + (4 - i))
        done = length
    assert modelled.stats["modelled_ms"] == pytest.approx(expected_ms, abs=2)
    assert modelled.stats["decode_steps"] == lengths[-1]
    assert modelled.stats["row_steps"] == sum(lengths)
    assert modelled.stats["generated_tokens"] == sum(lengths)


def test_an_episodes_next_turn_prefills_only_its_new_ids(tokenizer):
    modelled = engine(tokenizer)
    serving = modelled.serving(max_rows=8, max_kv_tokens=0, max_requests=64)

    async def two_turns():
        first, _ = await serving.generate(request(0, prompt_len=30, key="episode"))
        prompt = list(range(1, 31)) + first.token_ids + [7, 7, 7]
        await serving.generate(
            CompletionRequest(prompt_ids=prompt, params=SamplingParams(max_new_tokens=200), key="episode")
        )
        return first

    first = asyncio.run(two_turns())
    assert modelled.stats["prefill_tokens"] == 30 + 3
    assert modelled.stats["reused_tokens"] == 30 + len(first.token_ids)
    modelled.release("episode")
    assert "episode" not in modelled.processed


def test_a_row_that_joins_later_leaves_when_its_own_reply_is_done(tokenizer):
    """Continuous batching: a short reply that joins a long one's batch is not held until the long one ends."""
    settings = ModelledEngineConfig(
        decode_step_s=0.005, decode_row_s=0.0, prefill_token_s=0.0, reply_tokens_median=60, reply_tokens_sigma=0.0
    )
    modelled = engine(tokenizer, settings)
    serving = modelled.serving(max_rows=8, max_kv_tokens=0, max_requests=64)

    async def play():
        long = asyncio.ensure_future(serving.generate(request(0, max_new_tokens=60)))
        await asyncio.sleep(0.05)  # about 10 steps in
        short, _ = await serving.generate(request(1, max_new_tokens=5))
        steps_when_short_ended = modelled.stats["decode_steps"]
        await long
        return short, steps_when_short_ended

    short, steps = asyncio.run(play())
    assert len(short.token_ids) == 5
    # The short row ran 5 steps beside the long one; the long one had 60 in all and was not finished then.
    assert steps < 60
    assert modelled.stats["decode_steps"] == 60
    assert math.isclose(modelled.stats["row_steps"], 65)

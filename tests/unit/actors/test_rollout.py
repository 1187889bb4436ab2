"""One real episode: tiny-random engine, in-process BabyAI, the rollout coroutine."""

import asyncio

from agentgym_rl.actors.chat import ChatFormat
from agentgym_rl.actors.rollout import run_episode
from agentgym_rl.configs.schema import SamplingConfig
from agentgym_rl.envs.actor import EnvHost
from tests.unit.actors.helpers import tiny_engine


def _play(tokenizer, *, horizon, max_context_tokens, max_new_tokens=12):
    engine = tiny_engine(tokenizer)
    # The host an env actor runs, used in-process: it stamps each observation with the env's state key.
    env = EnvHost("babyai", {"levels": ["GoToRedBall"]})
    returned = []  # what the engine handed back, turn by turn

    async def generate(prompt):
        generation = engine.generate([prompt], SamplingConfig(max_new_tokens=max_new_tokens))[0]
        returned.append(generation)
        return generation, engine.weights_version

    async def reset(task_id):
        return env.reset(task_id)

    async def step(text):
        return env.step(text)

    trajectory = asyncio.run(
        run_episode(
            env_name="babyai",
            instruction=env.instruction(),
            reset=reset,
            step=step,
            generate=generate,
            chat=ChatFormat(tokenizer),
            task_id=env.tasks("train")[0],
            group=0,
            horizon=horizon,
            max_new_tokens=max_new_tokens,
            max_context_tokens=max_context_tokens,
        )
    )
    return trajectory, returned


def test_sampled_ids_are_kept_exactly_and_only_they_are_in_the_loss(tokenizer):
    trajectory, returned = _play(tokenizer, horizon=3, max_context_tokens=4096)
    assert trajectory.num_turns == len(returned) == 3
    for (start, end), generation in zip(trajectory.turn_spans, returned, strict=True):
        assert trajectory.token_ids[start:end] == generation.token_ids
        assert trajectory.logprobs[start:end] == generation.logprobs
    in_spans = {i for start, end in trajectory.turn_spans for i in range(start, end)}
    assert {i for i, m in enumerate(trajectory.loss_mask) if m} == in_spans
    assert sum(trajectory.loss_mask) == sum(len(g.token_ids) for g in returned)
    assert len(trajectory.token_ids) == len(trajectory.loss_mask) == len(trajectory.logprobs)
    assert trajectory.truncated and trajectory.truncation_reason == "horizon"
    # environment text follows each reply as template-rendered ids
    assert trajectory.messages[0]["role"] == "system" and trajectory.messages[1]["content"].startswith("Your goal:")
    assert [m["role"] for m in trajectory.messages[2:]] == ["assistant", "user"] * 3
    assert trajectory.loss_mask[-1] == 1  # nothing follows the last reply


def test_context_limit_truncates_before_overflowing(tokenizer):
    trajectory, returned = _play(tokenizer, horizon=50, max_context_tokens=700, max_new_tokens=40)
    assert trajectory.truncated and trajectory.truncation_reason == "context"
    assert len(trajectory.token_ids) <= 700
    assert trajectory.num_turns == len(returned)


def test_each_turn_records_the_state_it_acted_from_and_whether_its_reply_hit_the_cap(tokenizer):
    trajectory, returned = _play(tokenizer, horizon=3, max_context_tokens=4096, max_new_tokens=6)
    assert trajectory.turn_capped == [g.finish_reason == "length" for g in returned]
    assert any(trajectory.turn_capped)  # tiny-random rarely stops within 6 tokens
    # the first turn acts from the reset state; the env is replayed to read the later ones
    replay = EnvHost("babyai", {"levels": ["GoToRedBall"]})
    expected = [replay.reset(trajectory.task_id).state_key]
    for action in trajectory.actions[:-1]:
        expected.append(replay.step(action).state_key)
    assert trajectory.state_keys == expected and None not in expected

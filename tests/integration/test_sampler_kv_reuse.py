"""SamplerActor on real Ray with real BabyAI env actors: episodes played with per-episode KV reuse are
identical to episodes that re-prefill every turn, the cache is empty once they end, and stop strings
from the config end turns."""

from __future__ import annotations

import pytest
import ray

from agentgym_rl.actors.model_store import load_tokenizer, resolve_dtype
from agentgym_rl.actors.sampler import EpisodeRequest, SamplerActor, start_collect
from agentgym_rl.configs import load_config
from agentgym_rl.envs import make
from tests.factories import RECIPE

HORIZON = 3  # every episode's turn limit, on its request

STOP = "e"  # frequent in the random model's text, so most turns end on it
# Largest log-prob difference between reused and recomputed keys/values, by the dtype the engine computes in.
# bfloat16 keeps 8 significant bits (2^-8 = 0.004 relative), and a key computed with one turn's tokens and the same
# key recomputed with the whole prompt may round apart: 4.9e-4 measured on an AMD EPYC family 25 running `auto` in
# bfloat16, 1e-6 on family 26 (bfloat16 too).
LOGPROB_TOLERANCE = {"float32": 1e-5, "bfloat16": 4e-3}


def kv_config(kv_cache_tokens: int):
    return load_config(
        RECIPE,
        [
            "model.name=tiny-random",
            "env.options.levels=[GoToObjS6]",
            "sampler.envs_per_sampler=4",
            "sampler.num_cpus=0.25",
            "sampler.num_threads=1",
            "sampler.sampling.max_new_tokens=8",
            f"sampler.sampling.stop=[{STOP}]",
            f"sampler.kv_cache_tokens={kv_cache_tokens}",
        ],
    )


def start_sampler(kv_cache_tokens: int):
    config = kv_config(kv_cache_tokens)
    sampler = (
        ray.remote(SamplerActor)
        .options(num_cpus=0.25, max_concurrency=100)
        .remote(index=0, model=config.model, sampler=config.sampler, env=config.env, seed=0)
    )
    return sampler


@pytest.mark.slow
def test_kv_reuse_plays_identical_episodes_and_frees_its_cache(ray_local):
    tasks = make("babyai", {"levels": ["GoToObjS6"]}).tasks("train")[:6]
    requests = [EpisodeRequest(task_id=task, group=g, seed=1000 + g, horizon=HORIZON) for g, task in enumerate(tasks)]
    played = {}
    states = {}
    for cached_tokens in (0, 50_000):
        sampler = start_sampler(cached_tokens)
        played[cached_tokens] = ray.get(start_collect(sampler, requests))
        states[cached_tokens] = ray.get(sampler.state.remote())
        ray.kill(sampler)
    plain, reused = played[0], played[50_000]
    assert [t.token_ids for t in reused] == [t.token_ids for t in plain]
    assert [t.loss_mask for t in reused] == [t.loss_mask for t in plain]
    # `auto` as the samplers resolved it: bfloat16 or float32 depending on the machine (actors.models.resolve_dtype).
    tolerance = LOGPROB_TOLERANCE[resolve_dtype(kv_config(0).sampler.dtype)]
    for a, b in zip(reused, plain, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=tolerance)
    assert sum(t.num_turns for t in plain) > len(requests)  # later turns exist, so there was something to reuse
    assert states[0]["engine_reused_tokens"] == 0
    assert states[50_000]["engine_reused_tokens"] > states[50_000]["engine_prefill_tokens"]
    assert states[50_000]["engine_cached_tokens"] == 0  # every ended episode released its entry

    tokenizer = load_tokenizer("tiny-random")
    ended_on_stop = 0
    for trajectory in reused:
        for start, end in trajectory.turn_spans:
            reply = trajectory.token_ids[start:end]
            # A turn ends on the token that completes the stop string, and not before.
            assert STOP not in tokenizer.decode(reply[:-1], skip_special_tokens=True)
            ended_on_stop += STOP in tokenizer.decode(reply, skip_special_tokens=True)
    assert ended_on_stop > 0

import torch

from actors.engines import make_engine
from actors.models import load_model
from actors.weights import pack_state_dict
from configs.schema import SamplingConfig


def _engine(tokenizer, seed=0):
    return make_engine(
        "transformers",
        model_name="tiny-random",
        dtype="float32",
        seed=seed,
        stop_token_ids=[tokenizer.eos_token_id],
        pad_token_id=tokenizer.pad_token_id,
    )


PROMPTS = [[1, 2, 3, 4, 5], [9, 8], [7, 7, 7, 7, 7, 7, 7, 7]]


def test_same_seed_same_samples_and_different_seed_different_samples(tokenizer):
    sampling = SamplingConfig(max_new_tokens=12)
    first = _engine(tokenizer, seed=3).generate(PROMPTS, sampling)
    again = _engine(tokenizer, seed=3).generate(PROMPTS, sampling)
    other = _engine(tokenizer, seed=4).generate(PROMPTS, sampling)
    assert [g.token_ids for g in first] == [g.token_ids for g in again]
    assert [g.token_ids for g in first] != [g.token_ids for g in other]


def test_logprobs_match_a_full_forward_of_each_prompt_alone(tokenizer):
    sampling = SamplingConfig(max_new_tokens=8, temperature=0.7)
    generations = _engine(tokenizer).generate(PROMPTS, sampling)
    model = load_model("tiny-random")
    for prompt, generation in zip(PROMPTS, generations, strict=True):
        assert len(generation.token_ids) == len(generation.logprobs) > 0
        ids = torch.tensor([prompt + generation.token_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1] / sampling.temperature
        expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(generation.token_ids)[:, None]).squeeze(-1)
        # Left padding in the batch must not change any row's distribution.
        assert torch.allclose(torch.tensor(generation.logprobs), expected, atol=1e-4)


def test_each_row_stops_at_its_own_stop_token(tokenizer):
    greedy = SamplingConfig(max_new_tokens=6, top_k=1)
    free = _engine(tokenizer).generate(PROMPTS, greedy)
    stop = free[0].token_ids[2]
    engine = make_engine(
        "transformers",
        model_name="tiny-random",
        dtype="float32",
        seed=0,
        stop_token_ids=[stop],
        pad_token_id=tokenizer.pad_token_id,
    )
    stopped = engine.generate(PROMPTS, greedy)
    for before, after in zip(free, stopped, strict=True):
        if stop in before.token_ids:
            cut = before.token_ids.index(stop) + 1
            assert after.token_ids == before.token_ids[:cut] and after.finish_reason == "stop"
        else:
            assert after.token_ids == before.token_ids and after.finish_reason == "length"
    assert stopped[0].finish_reason == "stop"


def test_load_weights_adopts_version_and_values(tokenizer):
    engine = _engine(tokenizer)
    model = load_model("tiny-random")
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(0.5)
    engine.load_weights(pack_state_dict(model.state_dict(), version=7))
    assert engine.weights_version == 7
    for (name, mine), theirs in zip(engine.model.state_dict().items(), model.state_dict().values(), strict=True):
        assert torch.equal(mine, theirs), name


def test_top_k_one_is_greedy(tokenizer):
    sampling = SamplingConfig(max_new_tokens=6, top_k=1)
    a = _engine(tokenizer, seed=1).generate(PROMPTS, sampling)
    b = _engine(tokenizer, seed=2).generate(PROMPTS, sampling)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]

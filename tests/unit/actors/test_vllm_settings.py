"""`sampler.vllm` / `serve.vllm`: checked against the actor's GPUs and longest sequence, and given to vLLM."""

from __future__ import annotations

import pydantic
import pytest

from agentgym_rl.configs import Config
from tests.unit.actors.test_engine import VLLM_MISSING


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        ({"sampler": {"engine": "vllm", "vllm": {"tensor_parallel_size": 2}}}, "sampler.num_gpus=None reserves 1"),
        (
            {"sampler": {"engine": "vllm", "num_gpus": 1, "vllm": {"tensor_parallel_size": 4}}},
            "sampler.vllm.tensor_parallel_size=4 needs that many GPUs per engine",
        ),
        (
            {"sampler": {"engine": "vllm", "max_context_tokens": 4096, "vllm": {"max_model_len": 2048}}},
            "sampler.vllm.max_model_len=2048 is shorter than the longest sequence the sampler sends (4096 tokens)",
        ),
        (
            {"serve": {"engine": "vllm", "vllm": {"max_model_len": 1024}}},
            "serve.vllm.max_model_len=1024 is shorter than the longest sequence the serve sends (2304 tokens)",
        ),
    ],
)
def test_vllm_settings_that_do_not_fit_are_refused_naming_the_key(settings, problem):
    with pytest.raises(pydantic.ValidationError) as error:
        Config.model_validate(settings)
    assert problem in str(error.value)


def test_vllm_settings_that_fit_are_accepted_and_ignored_by_the_transformers_engine():
    fits = Config.model_validate({"sampler": {"engine": "vllm", "num_gpus": 2, "vllm": {"tensor_parallel_size": 2}}})
    assert fits.sampler.vllm.tensor_parallel_size == 2
    # Only the vLLM engine reads them: a transformers sampler keeps any values without a check.
    Config.model_validate({"sampler": {"vllm": {"tensor_parallel_size": 8}}})


@pytest.mark.slow  # vLLM's CPU build takes a minute to start beside other tests: in the slow tier's rotation
@pytest.mark.skipif(VLLM_MISSING, reason="needs vllm with a CUDA GPU, or vLLM's CPU build: ./install.sh --vllm")
def test_the_vllm_engine_takes_its_settings():
    from agentgym_rl.actors.engines import make_engine
    from agentgym_rl.configs.schema import VLLMConfig

    engine = make_engine(
        "vllm",
        model_name="tiny-random",
        dtype="float32",
        seed=0,
        stop_token_ids=[2],
        pad_token_id=2,
        vllm=VLLMConfig(max_model_len=512),
    )
    try:
        assert engine._llm.model_config.max_model_len == 512
    finally:
        engine.close()

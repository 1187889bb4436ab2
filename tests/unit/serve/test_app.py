"""Building the app without Ray: the engine choice, its start-up check, limits that cannot hold a request,
and the 503 (in OpenAI's shape) while the model loads."""

from __future__ import annotations

import importlib.util

import openai
import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from agentgym_rl.configs import Config
from agentgym_rl.configs.schema import ServeConfig
from agentgym_rl.serve.app import ServeArgs, ServeError, build_app
from agentgym_rl.serve.policy_api import PolicyAPI
from agentgym_rl.serve.routes import build_api


def test_serving_uses_the_training_samplers_engine_unless_serve_engine_is_set():
    assert ServeArgs(model="tiny-random").engine == "transformers"
    trained = Config.model_validate({"model": {"name": "tiny-random"}, "sampler": {"engine": "vllm"}})
    args = ServeArgs.for_training(trained)
    assert args.engine == "vllm" and args.model == "tiny-random" and args.dtype == trained.sampler.dtype
    chosen = trained.model_copy(update={"serve": ServeConfig(engine="transformers")})
    assert ServeArgs.for_training(chosen).engine == "transformers"


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_vllm_engine_without_vllm_fails_at_start_saying_what_to_do():
    with pytest.raises(ServeError, match=r"serve.engine='vllm' needs the vllm package.*pip install"):
        build_app(ServeArgs(model="tiny-random", serve=ServeConfig(engine="vllm")))


def test_limits_that_cannot_hold_the_largest_request_are_config_errors():
    with pytest.raises(ValidationError, match="kv_cache_tokens"):
        ServeConfig(kv_cache_tokens=1000, max_prompt_tokens=900, max_tokens=200)
    with pytest.raises(ValidationError, match="max_n"):
        ServeConfig(max_n=8, max_batch_size=4)


class UnloadedPolicy:
    """A model replica whose model is still loading: never called."""

    def __getattr__(self, name):
        raise AssertionError(f"the model was called ({name}) while it was loading")


def test_while_the_model_loads_requests_get_503_in_openais_shape():
    async def loading() -> bool:
        return False

    api = PolicyAPI(
        UnloadedPolicy(), model_id="tiny-random", source="tiny-random", limits=ServeConfig(), model_ready=loading
    )
    http = TestClient(build_api(api), base_url="http://127.0.0.1")
    response = http.get("/healthz")
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    assert response.json() == {
        "error": {
            "message": "the model is still loading; retry in a few seconds",
            "type": "service_unavailable_error",
            "param": None,
            "code": "model_loading",
        }
    }
    client = openai.OpenAI(base_url="http://127.0.0.1/v1", api_key="k", http_client=http, max_retries=0)
    with pytest.raises(openai.InternalServerError, match="still loading") as info:
        client.chat.completions.create(model="tiny-random", messages=[{"role": "user", "content": "hi"}])
    assert info.value.status_code == 503 and info.value.body["code"] == "model_loading"
    # A bad request is still told what is wrong, loading or not.
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny-random", messages=[{"role": "user", "content": "hi"}], n=99)

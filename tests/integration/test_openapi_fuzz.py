"""Both HTTP surfaces' OpenAPI schemas, fuzzed by Schemathesis with every check on: the env server in process
(ASGI), the policy endpoint over HTTP with a live replica and its episode routes.

Every route's request body and every status it answers are declared, so the fuzzer reaches the handlers
and can hold each answer to the schema: no 5xx, no status, header or body outside what is declared, no
schema-valid request refused as malformed. Fixed seed, bounded examples.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings

from agentgym_rl.actors.models import TINY_RANDOM
from agentgym_rl.actors.weight_sync import free_port
from agentgym_rl.configs.schema import EpisodesConfig, ServeConfig
from agentgym_rl.envs.http import build_app
from agentgym_rl.serve.app import ServeArgs, start_server, stop_server

ENV_SERVER = schemathesis.openapi.from_asgi("/openapi.json", build_app("babyai", max_envs=8))


@ENV_SERVER.parametrize()
@settings(max_examples=100, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
def test_env_server_answers_as_its_schema_says(case):
    case.call_and_validate()


def test_every_env_server_route_declares_its_body_and_error_statuses():
    spec = ENV_SERVER.raw_schema
    for path, methods in spec["paths"].items():
        for method, operation in methods.items():
            statuses = set(operation["responses"])
            assert {"200", "401", "422", "500"} <= statuses, f"{method} {path}: {sorted(statuses)}"
            if method == "post" and path != "/create":
                assert "requestBody" in operation, f"{method} {path} declares no body"
    pytest.importorskip("schemathesis")  # the fuzz test above needs it; this one reads the schema only


@pytest.fixture(scope="module")
def endpoint(ray_local):
    """The policy endpoint served by Ray Serve on 127.0.0.1: a live tiny-random replica and its episode book."""
    port = free_port()
    limits = ServeConfig(
        port=port, max_tokens=8, max_prompt_tokens=8192, max_body_bytes=8192, max_n=2, episodes=EpisodesConfig()
    )
    start_server(ServeArgs(model=TINY_RANDOM, dtype="float32", serve=limits))
    yield f"http://127.0.0.1:{port}"
    stop_server()


def test_policy_endpoint_answers_as_its_schema_says(endpoint):
    # Loaded here, not at import: the schema comes from the live server (the schemathesis pytest plugin's
    # fixture-based schemas do not run under this pytest), so each operation's strategy is driven directly.
    schema = schemathesis.openapi.from_url(f"{endpoint}/openapi.json")
    for result in schema.get_all_operations():
        operation = result.ok()

        @given(case=operation.as_strategy())
        @settings(max_examples=50, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
        def answers_as_declared(case):
            case.call_and_validate()

        answers_as_declared()

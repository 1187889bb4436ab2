"""The env server's OpenAPI schema, fuzzed by Schemathesis with every check on, in process (ASGI).

Every route's request body and every status it answers are declared, so the fuzzer reaches the handlers
and can hold each answer to the schema: no 5xx, no status, header or body outside what is declared, no
schema-valid request refused as malformed. Fixed seed, bounded examples.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from agentgym_rl.envs.http import build_app

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

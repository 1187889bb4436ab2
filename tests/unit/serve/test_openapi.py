"""The policy endpoint's OpenAPI schema declares every route's body and the statuses it answers."""

from __future__ import annotations

from agentgym_rl.configs.schema import ServeConfig
from agentgym_rl.serve.policy_api import PolicyAPI
from agentgym_rl.serve.routes import build_api


async def _never() -> bool:
    return False


def schema() -> dict:
    api = PolicyAPI(None, model_id="policy", source="tiny-random", limits=ServeConfig(), model_ready=_never)
    return build_api(api).openapi()


def refs(node: object) -> set[str]:
    if isinstance(node, dict):
        found = {node["$ref"]} if isinstance(node.get("$ref"), str) else set()
        return found.union(*(refs(value) for value in node.values()))
    if isinstance(node, list):
        return set().union(*(refs(value) for value in node))
    return set()


def test_bodies_and_error_statuses_are_declared_and_every_reference_resolves():
    spec = schema()
    paths = spec["paths"]
    bodies = [
        ("/v1/chat/completions", "ChatCompletionRequest"),
        ("/v1/responses", "ResponsesRequest"),
        ("/v1/act", "ActRequest"),
        ("/v1/episodes", "EpisodeOpenRequest"),
        ("/v1/episodes/{episode_id}/reward", "EpisodeReward"),
    ]
    for path, model in bodies:
        operation = paths[path]["post"]
        body = operation["requestBody"]["content"]["application/json"]["schema"]
        assert body == {"$ref": f"#/components/schemas/{model}"} and operation["requestBody"]["required"]
        assert {"400", "401", "413", "500"} <= set(operation["responses"]), path
        assert operation["responses"]["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
    chat = paths["/v1/chat/completions"]["post"]["responses"]
    assert {"200", "403", "404", "409", "429", "503"} <= set(chat)  # 403, 409: calls of an episode
    assert {"201", "429"} <= set(paths["/v1/episodes"]["post"]["responses"])
    assert {"200", "403", "404", "409"} <= set(paths["/v1/episodes/{episode_id}/reward"]["post"]["responses"])
    [header] = [p for p in paths["/v1/episodes/{episode_id}"]["get"]["parameters"] if p["in"] == "header"]
    assert header["name"] == "X-Episode-Token" and header["required"]
    streamed = chat["200"]["content"]
    assert set(streamed) == {"application/json", "text/event-stream"}
    for path in ("/v1/models", "/v1/policy"):
        assert {"200", "401", "500"} <= set(paths[path]["get"]["responses"]), path
    components = spec["components"]["schemas"]
    assert {ref.rsplit("/", 1)[-1] for ref in refs(spec)} <= set(components)
    assert "messages" in components["ChatCompletionRequest"]["properties"]

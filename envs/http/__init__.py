"""AgentGym-compatible HTTP env server (``build_app``) and the client env that drives such servers."""

from agentgym_rl.envs.http.client import AgentGymClient
from agentgym_rl.envs.http.server import build_app

__all__ = ["AgentGymClient", "build_app"]

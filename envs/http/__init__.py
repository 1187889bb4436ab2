"""AgentGym-compatible HTTP env server (``build_app``) and the client env that drives such servers."""

from envs.http.client import AgentGymClient
from envs.http.server import build_app

__all__ = ["AgentGymClient", "build_app"]

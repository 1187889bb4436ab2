"""The web environment (WebArena-style tasks on bundled sites) and the client for AgentGym's WebArena server."""

from envs.web.env import WebEnv
from envs.web.remote import WebArenaClient

__all__ = ["WebArenaClient", "WebEnv"]

"""The web environment (WebArena-style tasks on bundled sites) and the client for AgentGym's WebArena server."""

from agentgym_rl.envs.web.env import WebEnv
from agentgym_rl.envs.web.remote import WebArenaClient

__all__ = ["WebArenaClient", "WebEnv"]

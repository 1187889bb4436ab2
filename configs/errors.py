"""The one error hierarchy: every error a user can act on derives from ``AgentGymError``.

The command line catches ``AgentGymError`` once, prints its message on one line and exits 2, so each
message says what was wrong and what to change.
"""

from __future__ import annotations


class AgentGymError(Exception):
    """A problem with the user's input or setup that the message explains (config, model, env, run directory,
    cluster, data); never a bug in this project."""

"""The driver's errors: a run that cannot start or continue, and a lost learner."""

from __future__ import annotations

from agentgym_rl.configs.errors import AgentGymError


class TrainError(AgentGymError):
    """A run that cannot start or continue; the message says what to change."""


class LearnerLost(TrainError):
    """A learner actor died and ``trainer.on_learner_failure`` is ``restart``: the loop restarts the learners
    (one that escapes the loop, e.g. while resuming, ends the run like any ``TrainError``)."""

"""``EnvActor``: one environment instance hosted in its own Ray actor."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from agentgym_rl.envs.base import EnvError, InvalidAction, Observation, StepResult, state_digest
from agentgym_rl.envs.registry import make
from agentgym_rl.envs.tools import Function, ToolCall

if TYPE_CHECKING:
    import ray


def hide_unreserved_gpus() -> None:
    """In a Ray actor that reserved no GPU, make every GPU invisible (``CUDA_VISIBLE_DEVICES=""``) and DeepSpeed's
    accelerator the CPU (``DS_ACCELERATOR=cpu``, unless set).

    Ray sets ``CUDA_VISIBLE_DEVICES`` to the reserved GPUs for an actor that reserves some and, in the
    versions this project runs on, leaves it unset for one that reserves none, which would then see every
    GPU of its node. Each actor calls this first in ``__init__``, before anything initialises CUDA. Outside
    a Ray actor (a test, a script using a class directly) it does nothing, and that includes a machine without
    Ray, where the learner runs as a plain class (``benchmarks/gpu_check.py``).
    """
    try:
        import ray
    except ImportError:
        return
    if not ray.is_initialized():
        return
    context = ray.get_runtime_context()
    if context.get_actor_id() is not None and not ray.get_gpu_ids():
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        # DeepSpeed (imported by transformers' save_pretrained through accelerate, where installed) then picks the
        # CPU anyway, after a warning that it found no accelerator; named here, it picks it without one.
        os.environ.setdefault("DS_ACCELERATOR", "cpu")


class EnvRestarted(EnvError):
    """The env actor holds no episode to act on: Ray restarted it after its process died (so the
    episode is gone), or no reset was ever made."""


class EnvHost:
    """Holds one ``TextEnv``; every method is a thin pass-through so the env stays the single source of truth."""

    def __init__(self, name: str, options: dict[str, Any] | None = None) -> None:
        hide_unreserved_gpus()
        self.env = make(name, options)
        # Ray runs __init__ again in a fresh process after a crash (max_restarts), so an actor that is
        # stepped without a reset of its own has lost its episode: callers retry that on a fresh one.
        self.has_episode = False

    def _check_episode(self) -> None:
        if not self.has_episode:
            raise EnvRestarted(
                "this env actor holds no episode: it was restarted after its process died (or never reset)"
            )

    def instruction(self) -> str:
        return self.env.instruction

    def tool_instruction(self) -> str:
        return self.env.tool_instruction

    def functions(self) -> list[Function]:
        return self.env.functions()

    def tasks(self, split: str) -> Sequence[int]:
        return list(self.env.tasks(split))

    def reset(self, task_id: int) -> Observation:
        """The env's first observation, with the digest of its ``state_key`` after the reset."""
        observation = self.env.reset(task_id)
        self.has_episode = True
        return observation.model_copy(update={"state_key": state_digest(self.env.state_key())})

    def step(self, action_text: str) -> StepResult:
        """The env's step result, with the digest of its ``state_key`` after the step (None once done)."""
        self._check_episode()
        result = self.env.step(action_text)
        if result.done:  # no turn acts from the final state
            return result
        return result.model_copy(update={"state_key": state_digest(self.env.state_key())})

    def step_call(self, call: ToolCall) -> tuple[str, StepResult] | InvalidAction:
        """Step on the action ``call`` stands for (``env.action_of_call``): the action text sent and the step
        result; or why the call stands for no action, the env not stepped."""
        self._check_episode()
        action = self.env.action_of_call(call)
        if isinstance(action, InvalidAction):
            return action
        return action, self.step(action)

    def oracle_reply(self) -> str:
        """The oracle's next move as model text: ``Action: <action>`` when the env parses that back to
        the action, else the oracle's text as is (envs whose actions are tags, like ``<answer>``)."""
        action = self._oracle_action()
        reply = f"Action: {action}"
        return reply if self.env.parse_action(reply) == action else action

    def oracle_call(self) -> ToolCall:
        """The oracle's next move as a function call (``env.call_of_action``), for tool-format demonstrations."""
        action = self._oracle_action()
        call = self.env.call_of_action(action)
        if call is None:
            raise EnvError(
                f"env {self.env.name!r}: no function expresses the oracle's action {action!r} (call_of_action gives "
                "None); play the oracle with env.action_format=text"
            )
        return call

    def _oracle_action(self) -> str:
        self._check_episode()
        if not self.env.has_oracle():
            raise EnvError(f"env {self.env.name!r} has no oracle; sampler.policy=oracle needs one")
        return self.env.oracle_action()

    def health(self) -> bool:
        return True

    def close(self) -> None:
        self.env.close()


def create_env_actor(
    name: str, options: dict[str, Any] | None = None, *, num_cpus: float = 0.05
) -> ray.actor.ActorHandle:
    """Start an ``EnvActor`` for env ``name``; Ray restarts it (up to 3 times) if its process dies."""
    import ray

    actor_cls = ray.remote(EnvHost).options(num_cpus=num_cpus, max_restarts=3, name=None)
    return actor_cls.remote(name, options)

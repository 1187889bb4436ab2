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
    """Holds ``instances`` instances of one ``TextEnv`` (one by default), each in its own slot; every method is a thin
    pass-through to a slot's env, so the env stays the single source of truth.

    One process per env instance is the plain layout. Several instances in one process (``sampler.envs_per_actor``)
    share Ray's per-process cost (about 60 MB, a second of start-up, and a wake-up every 10 ms) among them; their
    calls then run one after another, so it suits envs whose steps are quick and do not wait on I/O.
    """

    def __init__(self, name: str, options: dict[str, Any] | None = None, instances: int = 1) -> None:
        hide_unreserved_gpus()
        self.envs = [make(name, options) for _ in range(instances)]
        # Ray runs __init__ again in a fresh process after a crash (max_restarts), so a slot that is stepped
        # without a reset of its own has lost its episode: callers retry that on a fresh one.
        self.has_episode = [False] * instances

    @property
    def env(self):
        """The first slot's env: what every slot's env says alike (instruction, functions, tasks)."""
        return self.envs[0]

    def _check_episode(self, slot: int) -> None:
        if not self.has_episode[slot]:
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

    def reset(self, task_id: int, slot: int = 0) -> Observation:
        """Slot ``slot``'s env's first observation, with the digest of its ``state_key`` after the reset."""
        env = self.envs[slot]
        observation = env.reset(task_id)
        self.has_episode[slot] = True
        return observation.model_copy(update={"state_key": state_digest(env.state_key())})

    def step(self, action_text: str, slot: int = 0) -> StepResult:
        """Slot ``slot``'s env's step result, with the digest of its ``state_key`` after the step (None once done)."""
        self._check_episode(slot)
        env = self.envs[slot]
        result = env.step(action_text)
        if result.done:  # no turn acts from the final state
            return result
        return result.model_copy(update={"state_key": state_digest(env.state_key())})

    def step_call(self, call: ToolCall, slot: int = 0) -> tuple[str, StepResult] | InvalidAction:
        """Step slot ``slot`` on the action ``call`` stands for (``env.action_of_call``): the action text sent and the
        step result; or why the call stands for no action, the env not stepped."""
        self._check_episode(slot)
        action = self.envs[slot].action_of_call(call)
        if isinstance(action, InvalidAction):
            return action
        return action, self.step(action, slot)

    def oracle_reply(self, slot: int = 0) -> str:
        """The oracle's next move in slot ``slot`` as model text: ``Action: <action>`` when the env parses that back
        to the action, else the oracle's text as is (envs whose actions are tags, like ``<answer>``)."""
        action = self._oracle_action(slot)
        reply = f"Action: {action}"
        return reply if self.envs[slot].parse_action(reply) == action else action

    def oracle_call(self, slot: int = 0) -> ToolCall:
        """The oracle's next move in slot ``slot`` as a function call (``env.call_of_action``), for tool-format
        demonstrations."""
        action = self._oracle_action(slot)
        env = self.envs[slot]
        call = env.call_of_action(action)
        if call is None:
            raise EnvError(
                f"env {env.name!r}: no function expresses the oracle's action {action!r} (call_of_action gives "
                "None); play the oracle with env.action_format=text"
            )
        return call

    def _oracle_action(self, slot: int) -> str:
        self._check_episode(slot)
        env = self.envs[slot]
        if not env.has_oracle():
            raise EnvError(f"env {env.name!r} has no oracle; sampler.policy=oracle needs one")
        return env.oracle_action()

    def health(self) -> bool:
        return True

    def close(self) -> None:
        for env in self.envs:
            env.close()


def create_env_actor(
    name: str, options: dict[str, Any] | None = None, *, num_cpus: float = 0.05
) -> ray.actor.ActorHandle:
    """Start an ``EnvActor`` for env ``name``; Ray restarts it (up to 3 times) if its process dies."""
    import ray

    actor_cls = ray.remote(EnvHost).options(num_cpus=num_cpus, max_restarts=3, name=None)
    return actor_cls.remote(name, options)

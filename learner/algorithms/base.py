"""The algorithm plug-in API and its registry.

A user algorithm subclasses :class:`Algorithm` (or :class:`PolicyGradient` to reuse the clipped
surrogate, KL and entropy terms), declares its hyperparameters as a nested pydantic ``Config``,
fills the hooks, and is selected in YAML by its registered name or as ``package.module:ClassName``.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
from pydantic import ConfigDict, Field, ValidationError

from agentgym_rl.configs.errors import AgentGymError
from agentgym_rl.configs.strict import StrictNumbers
from agentgym_rl.configs.targets import import_target

if TYPE_CHECKING:
    from agentgym_rl.actors.trajectory import Trajectory

# Batch columns (see learner.batching.collate) and forward outputs the hooks receive. Every
# per-token column is (B, T) and aligned with next-token targets.
INPUT_IDS = "input_ids"
LOSS_MASK = "loss_mask"
REWARDS = "rewards"
GROUPS = "groups"
COUNTED = "counted"
TRUNCATED = "truncated"
TOKEN_REWARDS = "token_rewards"
SAMPLER_LOGPROBS = "sampler_logprobs"
TURN_IDS = "turn_ids"
STATE_IDS = "state_ids"
TURN_CAPPED = "turn_capped"
ADVANTAGES = "advantages"
RETURNS = "returns"
OLD_LOGPROBS = "old_logprobs"
REF_LOGPROBS = "ref_logprobs"
OLD_VALUES = "old_values"
LOGPROBS = "logprobs"
ENTROPY = "entropy"
VALUES = "values"


class AlgorithmParams(StrictNumbers):
    """Hyperparameters every algorithm has; subclasses add their own fields (numbers refuse booleans)."""

    model_config = ConfigDict(extra="forbid")

    aggregation: Literal["token_mean", "seq_mean"] = Field(
        "token_mean", description="Loss reduction: mean over sampled tokens, or per episode then over episodes."
    )


class AlgorithmConfigError(AgentGymError, ValueError):
    """The ``algorithm`` section does not fit the chosen algorithm; the message names the key."""


class Algorithm(abc.ABC):
    """Turns a batch of trajectories into a loss.

    The learner calls ``compute_advantages`` once per batch, before any gradient step, with
    ``old_logprobs`` (and ``ref_logprobs`` / ``old_values`` when the algorithm needs a reference
    model / critic) already in the batch; it stores the result as ``batch["advantages"]``. Then, for
    every micro-batch of every minibatch of every epoch, it calls ``compute_loss``.

    Args:
        config: the algorithm's own ``Config``.
    """

    name: ClassVar[str] = ""
    Config: ClassVar[type[AlgorithmParams]] = AlgorithmParams
    needs_critic: ClassVar[bool] = False

    def __init__(self, config: AlgorithmParams) -> None:
        self.config = config

    @property
    def needs_reference(self) -> bool:
        """Whether the learner keeps a frozen reference model and provides ``ref_logprobs``."""
        return False

    @property
    def uses_old_logprobs(self) -> bool:
        """Whether the loss or the advantages read ``old_logprobs`` at all (SFT and DPO do not: the learner
        then never scores the batch for them and fills ``old_logprobs`` from the training forward)."""
        return True

    @property
    def differentiates_entropy(self) -> bool:
        """Whether ``compute_loss`` differentiates ``forward_out["entropy"]`` (an entropy bonus). When it does
        not, the learner computes the entropy without its autograd graph, for metrics only: the backward then
        keeps no (tokens, vocabulary) float32 tensors for it. True by default, the safe answer for an algorithm
        that does not say."""
        return True

    @property
    def advantages_read_old_logprobs(self) -> bool:
        """Whether ``compute_advantages`` reads ``old_logprobs``. When it does not and each batch gets one
        optimizer step, the learner fills ``old_logprobs`` from the training forward itself (detached)
        just before ``compute_loss`` instead of scoring the batch in a pass of its own. True by default,
        the safe answer for an algorithm that does not say."""
        return self.uses_old_logprobs

    @property
    def uses_state_keys(self) -> bool:
        """Whether the advantages read the env's per-turn state keys (``state_ids``); the driver warns at start
        about an env that supplies none."""
        return False

    @property
    def corrects_rollout_mismatch(self) -> bool:
        """Whether the loss weighs tokens by the learner's old log-prob against the sampler's (which is
        meaningless when the old log-probs are the sampler's own, ``learner.old_logprobs: sampler``)."""
        return False

    def select_trajectories(self, trajectories: list[Trajectory]) -> list[Trajectory]:
        """The rows the learner trains on, in order; by default every trajectory once.

        An algorithm that learns from arrangements of episodes (e.g. preference pairs) returns them
        here; an episode may appear several times or not at all.
        """
        return trajectories

    @property
    def skips_uninformative_groups(self) -> bool:
        """Whether ``select_trajectories`` leaves out whole task groups that carry no signal (e.g. GRPO's
        groups whose rewards are all equal); dynamic sampling refills a batch only for such algorithms."""
        return False

    def micro_batch_groups(self, batch: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """(B,) ids of rows that must share a minibatch and micro-batch (e.g. the two rows of a
        preference pair), or None when every row stands alone (the default)."""
        return None

    @abc.abstractmethod
    def compute_advantages(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Per-token advantages, shape (B, T) like ``batch["loss_mask"]``. May also add columns
        (e.g. ``returns``) and adjust ``loss_mask`` to exclude episodes from the loss."""

    @abc.abstractmethod
    def compute_loss(
        self, batch: dict[str, torch.Tensor], forward_out: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss of one micro-batch, reduced with ``config.aggregation``, and its metrics.

        Args:
            batch: micro-batch columns, including ``advantages`` and ``old_logprobs``; all (B, T).
            forward_out: ``logprobs`` (B, T) with grad, ``entropy`` (B, T) (with grad when
                ``differentiates_entropy``), and ``values`` for critics.

        Returns:
            (scalar loss, metrics named ``learner/...``).
        """


_REGISTRY: dict[str, type[Algorithm]] = {}


def register_algorithm(cls: type[Algorithm]) -> type[Algorithm]:
    """Class decorator: make ``cls`` selectable by ``cls.name``."""
    if not cls.name:
        raise ValueError(f"{cls.__qualname__} needs a non-empty `name` to be registered")
    _REGISTRY[cls.name] = cls
    return cls


def algorithm_names() -> list[str]:
    return sorted(_REGISTRY)


def resolve_algorithm(name: str) -> type[Algorithm]:
    """The class for a registered ``name`` or a ``package.module:ClassName`` reference.

    Raises:
        AlgorithmConfigError: unknown name, unimportable module, or not an ``Algorithm`` subclass.
    """
    if ":" not in name:
        if name not in _REGISTRY:
            raise AlgorithmConfigError(
                f"algorithm.name: unknown algorithm {name!r}; registered: {', '.join(algorithm_names())} "
                "(or give package.module:ClassName)"
            )
        return _REGISTRY[name]
    try:
        cls = import_target(name)
    except ImportError as exc:
        raise AlgorithmConfigError(f"algorithm.name: {name!r} cannot be imported: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        raise AlgorithmConfigError(f"algorithm.name: {name!r} is not a subclass of learner.Algorithm")
    return cls


def build_algorithm(name: str, params: dict[str, Any]) -> Algorithm:
    """Resolve ``name`` and validate ``params`` (the section's other keys) against its ``Config``.

    Raises:
        AlgorithmConfigError: naming every bad key as ``algorithm.<key>`` and the valid keys.
    """
    cls = resolve_algorithm(name)
    try:
        config = cls.Config.model_validate(params)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            where = "algorithm." + ".".join(str(p) for p in err["loc"])
            if err["type"] == "extra_forbidden":
                problems.append(f"{where}: unknown key for algorithm {name!r}")
            else:
                problems.append(f"{where}: {err['msg']} (got {err.get('input')!r})")
        valid = ", ".join(sorted(cls.Config.model_fields))
        raise AlgorithmConfigError(
            "; ".join(problems) + f". Valid keys for {name!r}: name, group_size, {valid}"
        ) from None
    return cls(config)

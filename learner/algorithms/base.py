"""The algorithm plug-in API and its registry.

A user algorithm subclasses :class:`Algorithm`, fills the two hooks, and is selected in YAML by
its registered name or as ``package.module:ClassName``.
"""

from __future__ import annotations

import abc
import importlib
from typing import ClassVar

import torch

from configs.schema import AlgorithmConfig

# Batch columns (see learner.batching.collate) and forward outputs the hooks receive.
INPUT_IDS = "input_ids"
LOSS_MASK = "loss_mask"
REWARDS = "rewards"
GROUPS = "groups"
TOKEN_REWARDS = "token_rewards"
ADVANTAGES = "advantages"
OLD_LOGPROBS = "old_logprobs"
REF_LOGPROBS = "ref_logprobs"
LOGPROBS = "logprobs"
ENTROPY = "entropy"


class Algorithm(abc.ABC):
    """Turns a batch of trajectories into a loss.

    The learner calls ``compute_advantages`` once per batch (before any gradient step), adds the
    result as ``batch["advantages"]`` together with ``old_logprobs`` (and ``ref_logprobs`` when
    ``needs_reference``), then calls ``compute_loss`` for each micro-batch.

    Args:
        config: the algorithm section of the run config.
    """

    name: ClassVar[str] = ""
    needs_critic: ClassVar[bool] = False

    def __init__(self, config: AlgorithmConfig) -> None:
        self.config = config

    @property
    def needs_reference(self) -> bool:
        """Whether the learner must keep a frozen reference model and provide ``ref_logprobs``."""
        return self.config.kl_coef > 0

    @abc.abstractmethod
    def compute_advantages(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Per-token advantages, shape (B, T) like ``batch["loss_mask"]``."""

    @abc.abstractmethod
    def compute_loss(
        self, batch: dict[str, torch.Tensor], forward_out: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss of one micro-batch (a token-mean over ``loss_mask``) and its metrics.

        Args:
            batch: micro-batch columns, including ``advantages``, ``old_logprobs`` and, when
                needed, ``ref_logprobs``; all (B, T).
            forward_out: ``logprobs`` (B, T) with grad and ``entropy`` (B, T).

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
        ValueError: unknown name, unimportable module, or a class that is not an ``Algorithm``.
    """
    if ":" not in name:
        if name not in _REGISTRY:
            raise ValueError(
                f"unknown algorithm {name!r}; registered: {', '.join(algorithm_names())} "
                "(or give package.module:ClassName)"
            )
        return _REGISTRY[name]
    module_name, _, attr = name.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"algorithm {name!r} cannot be imported: {exc}") from exc
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        raise ValueError(f"algorithm {name!r} is not a subclass of learner.Algorithm")
    return cls

"""Algorithms, registered by name; importing this package registers the shipped ones."""

from learner.algorithms.base import Algorithm, algorithm_names, register_algorithm, resolve_algorithm
from learner.algorithms.grpo import GRPO

__all__ = ["GRPO", "Algorithm", "algorithm_names", "register_algorithm", "resolve_algorithm"]

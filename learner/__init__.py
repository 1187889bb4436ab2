"""The learner: algorithms (plug-in API), batching, losses and the Ray learner actor."""

from learner.algorithms import GRPO, Algorithm, algorithm_names, register_algorithm, resolve_algorithm

__all__ = ["GRPO", "Algorithm", "algorithm_names", "register_algorithm", "resolve_algorithm"]

"""Torch threads per actor: as many as the CPUs Ray reserved for it.

Samplers, learners and env actors share a node's cores. An actor whose torch runs on every core of the
node oversubscribes them as soon as a second one computes (eight samplers on a 16-core GPU node would run
128 threads): each parallel region then waits for descheduled threads. An actor computes with the CPUs it
reserved (``num_cpus``, rounded, at least 1) unless its config names a thread count.
"""

from __future__ import annotations

import os

import torch


def reserved_cpus() -> int:
    """CPUs Ray reserved for the calling actor, rounded, at least 1; every core of this machine outside an
    actor (a driver, a test, a process without Ray)."""
    try:
        import ray  # here, not at the top: the learner imports this module where Ray is not installed
    except ImportError:
        return os.cpu_count() or 1
    if not ray.is_initialized() or ray.get_runtime_context().get_actor_id() is None:
        return os.cpu_count() or 1
    return max(1, round(ray.get_runtime_context().get_assigned_resources().get("CPU", 0.0)))


def set_torch_threads(configured: int) -> int:
    """Give torch ``configured`` intra-op threads, or with 0 the CPUs reserved for this actor
    (:func:`reserved_cpus`); returns the number set."""
    threads = configured or reserved_cpus()
    torch.set_num_threads(threads)
    return threads

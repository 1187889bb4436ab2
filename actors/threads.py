"""Torch threads per actor: on a GPU node, as many as the CPUs Ray reserved for it; on a CPU-only one, every core.

An actor that computes on a GPU uses its CPU threads for host-side work, and shares the node's cores with every
other actor there: with torch on every core, eight samplers on a 16-core GPU node ran 128 threads, and each
parallel region waited for descheduled ones. It takes the CPUs it reserved (``num_cpus``, rounded, at least 1).
An actor that computes on the CPU takes every core, as before: in sync mode rollout and update take turns, so
each phase computes on the whole machine (one thread per reserved CPU made the CPU quickstart's learner, which
reserves 1 of 2 cores, compute on half of them). A thread count in the actor's config wins over both.

On a machine that several runs share (a CI job running tests side by side, two experiments on one box), every
core per actor oversubscribes it: each parallel region waits for threads descheduled by the other runs. Setting
``AGENTGYM_RL_TORCH_THREADS`` caps the default of every actor and serving replica of the run (a count in the
config still wins).
"""

from __future__ import annotations

import os

from agentgym_rl.configs.errors import AgentGymError

THREADS_CAP_VAR = "AGENTGYM_RL_TORCH_THREADS"


class ThreadsCapError(AgentGymError, ValueError):
    """``AGENTGYM_RL_TORCH_THREADS`` is set to something other than a whole number of threads, at least 1."""


def default_threads(reserved: float | None, on_gpu: bool, cores: int) -> int:
    """The thread count of an actor that reserved ``reserved`` CPUs (None: outside an actor) and computes on a
    GPU or not, on a node of ``cores`` cores (see the module docstring)."""
    if reserved is None or not on_gpu:
        return cores
    return max(1, round(reserved))


def reserved_cpus() -> float | None:
    """CPUs Ray reserved for the calling actor; None outside an actor (a driver, a test, a process without Ray)."""
    try:
        import ray  # here, not at the top: the learner imports this module where Ray is not installed
    except ImportError:
        return None
    if not ray.is_initialized() or ray.get_runtime_context().get_actor_id() is None:
        return None
    return ray.get_runtime_context().get_assigned_resources().get("CPU", 0.0)


def thread_cap() -> int | None:
    """The cap ``AGENTGYM_RL_TORCH_THREADS`` sets, or None where it is unset.

    Raises:
        ThreadsCapError: it is set to something other than a whole number of threads, at least 1.
    """
    cap = os.environ.get(THREADS_CAP_VAR, "").strip()
    if not cap:
        return None
    if not cap.isdigit() or int(cap) < 1:
        raise ThreadsCapError(f"{THREADS_CAP_VAR} must be a whole number of threads, at least 1; it is {cap!r}")
    return int(cap)


def capped(threads: int) -> int:
    """``threads``, or fewer where ``AGENTGYM_RL_TORCH_THREADS`` caps the default (see the module docstring)."""
    cap = thread_cap()
    return threads if cap is None else min(threads, cap)


def set_torch_threads(configured: int) -> int:
    """Give torch ``configured`` intra-op threads, or with 0 :func:`default_threads` for this actor (capped);
    returns the number set."""
    import torch  # here: the command line reads the cap (``thread_cap``) before it loads torch

    threads = configured or capped(default_threads(reserved_cpus(), torch.cuda.is_available(), os.cpu_count() or 1))
    torch.set_num_threads(threads)
    return threads

"""Keeping freed tensor memory out of a process's resident set (glibc).

The sampler and the learner take turns in a synchronous run: one works while the other waits. Memory
that the waiting one freed but glibc still holds counts against the node as much as memory in use, and
Ray's memory monitor kills actors when the node reaches 95 %. Two settings keep it small: large blocks
get their own mappings (:func:`return_large_frees_to_the_os`), and an actor that has finished a phase
hands the free pages inside its heaps back (:func:`release_free_heap`).
"""

from __future__ import annotations

import ctypes
import ctypes.util

# mallopt's parameter number for the mmap threshold (glibc's malloc.h).
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 4 * 1024 * 1024


def _libc_function(name: str):
    """glibc's ``name``, or None where the C library has no such function (not glibc)."""
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c")), name)
    except (OSError, AttributeError, TypeError):
        return None


def return_large_frees_to_the_os() -> bool:
    """Serve every allocation of 4 MiB and more with its own mapping, unmapped when freed.

    glibc starts out so (from 128 KiB), but raises its threshold, up to 32 MiB, each time such a block
    is freed; from then on activations and packed weights come from the heap, and a heap keeps freed
    pages resident while live blocks sit above them, so each phase (an update, a weight publish, a
    checkpoint) adds its peak to the last one's leftovers. In the quickstart's SFT warm start the learner
    peaked at 6.7 GiB so, and at 3.8 GiB with this, at the same update speed (``benchmarks/memory.py``,
    ``benchmarks/learner.py``). Returns False where the C library has no ``mallopt`` (not glibc), where
    nothing changes.
    """
    mallopt = _libc_function("mallopt")
    if mallopt is None:
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1


def release_free_heap() -> bool:
    """Give the free pages inside glibc's heaps back to the OS (``malloc_trim(0)``).

    Blocks under the mmap threshold (a key/value cache entry, a decode step's small tensors) come from
    heaps that only shrink from their top, so after a phase they hold its peak: a sampler at horizon 10
    kept 7.8 GB resident while the learner updated, of which this returned 5.7 GB. Call it when a phase
    is over, not within one: the pages it returns are faulted in again when next used. Returns whether
    any memory went back (False also where the C library is not glibc).
    """
    trim = _libc_function("malloc_trim")
    if trim is None:
        return False
    trim.argtypes = [ctypes.c_size_t]
    return trim(0) == 1

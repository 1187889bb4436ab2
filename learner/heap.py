"""Keeping freed tensor memory out of the learner's resident set (glibc)."""

from __future__ import annotations

import ctypes
import ctypes.util

# mallopt's parameter number for the mmap threshold (glibc's malloc.h).
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 4 * 1024 * 1024


def return_large_frees_to_the_os() -> bool:
    """Serve every allocation of 4 MiB and more with its own mapping, unmapped when freed.

    glibc starts out so (from 128 KiB), but raises its threshold, up to 32 MiB, each time such a block
    is freed; from then on activations and packed weights come from the heap, and a heap keeps freed
    pages resident while live blocks sit above them, so each phase (an update, a weight publish, a
    checkpoint) adds its peak to the last one's leftovers. In the quickstart's SFT warm start the learner
    peaked at 6.7 GiB so, and at 3.8 GiB with this, at the same update speed (``benchmarks/memory.py``,
    ``benchmarks/learner.py``). Returns False where the C library has no
    ``mallopt`` (not glibc), where nothing changes.
    """
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c")).mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1

"""Lines that third-party code prints although they say nothing to the person running a command (a library's
retry notices, a progress bar drawn over a step the run reports itself): kept out of the output at their source,
every other line let through."""

from __future__ import annotations

import io
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from typing import Literal

# The swap of sys.stdout or sys.stderr is process-wide: bodies in two threads (an env server's) take turns, so
# neither restores the other's capture.
_swaps = {"stdout": threading.Lock(), "stderr": threading.Lock()}


@contextmanager
def without_lines(stream: Literal["stdout", "stderr"], prefixes: tuple[str, ...]) -> Iterator[None]:
    """Capture ``sys.<stream>`` while the body runs, then write on every captured line that does not start with
    one of ``prefixes`` (a progress bar's redraws, separated by carriage returns, are lines too). What another
    thread writes meanwhile comes out after the body, not lost; an exception leaves the body as it would without
    this (its traceback is printed by whoever handles it, outside the capture)."""
    captured = io.StringIO()
    redirect = redirect_stdout if stream == "stdout" else redirect_stderr
    try:
        with _swaps[stream], redirect(captured):
            yield
    finally:
        lines = captured.getvalue().splitlines(keepends=True)
        kept = [line for line in lines if line.strip("\r") and not line.lstrip("\r").startswith(prefixes)]
        getattr(sys, stream).write("".join(kept))

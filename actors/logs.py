"""structlog set-up: readable console lines on a terminal, JSON lines otherwise."""

from __future__ import annotations

import logging
import sys
import time
from collections import deque

import structlog

# Third-party loggers whose notices say nothing about the run, each shown from ERROR up: Ray's token-authentication
# set-up (a local instance turns token auth on by itself and says so at every start, and on a machine's first start
# that it wrote ~/.ray/auth_token).
QUIET_LOGGERS = ("ray._private.authentication.authentication_token_setup",)


def configure_logging(level: str = "info") -> None:
    """Route structlog to stderr at ``level``; console renderer on a TTY, JSON when piped. The ``QUIET_LOGGERS``
    show only their errors."""
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    renderer = (
        structlog.dev.ConsoleRenderer() if sys.stderr.isatty() else structlog.processors.JSONRenderer(sort_keys=True)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelNamesMapping()[level.upper()]),
        # The stream is looked up at each write, so a log line goes to whatever stderr is then (a caller or a
        # test harness may swap it after this call and close the old one).
        logger_factory=_print_to_current_stderr,
        cache_logger_on_first_use=False,
    )


def _print_to_current_stderr(*_args: object) -> structlog.PrintLogger:
    return structlog.PrintLogger(file=sys.stderr)


class Timeline:
    """An actor's latest events with their wall-clock times, newest last (the oldest drop out after ``keep``):
    what happened when, comparable across the actors of a node."""

    def __init__(self, keep: int = 64) -> None:
        self.events: deque[tuple[float, str]] = deque(maxlen=keep)

    def add(self, event: str) -> None:
        self.events.append((time.time(), event))

    def read(self) -> list[tuple[float, str]]:
        return list(self.events)

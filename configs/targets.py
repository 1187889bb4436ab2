"""``package.module:attr`` paths: how a config names code that a registry does not hold (a user's env, engine,
algorithm or loss), so that any process, an actor's included, can import it by itself."""

from __future__ import annotations

import importlib
from typing import Any


def import_target(target: str) -> Any:
    """The object that ``target`` (``package.module:attr``) names.

    Raises:
        ImportError: the module cannot be imported, has no such attribute, or the path is empty or relative.
    """
    module_name, _, attr = target.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError) as exc:  # ValueError: an empty or relative module name
        raise ImportError(str(exc)) from exc

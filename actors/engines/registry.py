"""Name -> engine class registry. Every engine is created through it (``make_engine``, ``make_serving_engine``).

The names and the import paths they stand for are kept in ``configs.engines`` (the config checks
``sampler.engine`` against them); this module adds user engines to that table and imports the classes.
"""

from __future__ import annotations

from agentgym_rl.actors.engines.base import Engine, UnknownEngineError
from agentgym_rl.configs.engines import add_engine_target, engine_names, engine_target
from agentgym_rl.configs.targets import import_target


def register_engine(name: str, engine: type[Engine]) -> None:
    """Make ``engine`` selectable as ``sampler.engine: <name>`` (and ``serve.engine`` if it has a serving form).

    A config validated after this keeps the class's import path (``package.module:Class``) for ``name``: the
    samplers and serve replicas run in other processes and import the class from there, so it must be defined
    at the top level of a module they can import (on ``PYTHONPATH`` or installed).

    Raises:
        UnknownEngineError: ``engine`` is not an ``Engine`` subclass, or cannot be imported by its path (defined
            in ``__main__`` or inside a function or class), or ``name`` is a shipped engine's.
    """
    if not (isinstance(engine, type) and issubclass(engine, Engine)):
        raise UnknownEngineError(f"register_engine({name!r}, {engine!r}): not a subclass of actors.engines.Engine")
    if engine.__module__ == "__main__" or engine.__qualname__ != engine.__name__:
        raise UnknownEngineError(
            f"register_engine({name!r}, {engine.__qualname__}): define the class at the top level of an importable "
            f"module (not in {engine.__module__}'s functions, classes or __main__), so that samplers can import it"
        )
    try:
        add_engine_target(name, f"{engine.__module__}:{engine.__name__}")
    except ValueError as exc:
        raise UnknownEngineError(str(exc)) from None


def engine_class(name: str) -> type[Engine]:
    """The class of engine ``name``: a registered name or a ``package.module:Class`` path.

    Raises:
        UnknownEngineError: ``name`` is not registered (the message lists the registered names), or its path
            cannot be imported or is not an ``Engine`` subclass.
    """
    try:
        target = engine_target(name)
    except ValueError as exc:
        raise UnknownEngineError(str(exc)) from None
    try:
        found = import_target(target)
    except ImportError as exc:
        raise UnknownEngineError(f"engine {name!r} names {target!r}, which cannot be imported: {exc}") from exc
    if not (isinstance(found, type) and issubclass(found, Engine)):
        raise UnknownEngineError(f"engine {name!r} names {target!r}, which is not a subclass of actors.engines.Engine")
    return found


__all__ = ["engine_class", "engine_names", "register_engine"]

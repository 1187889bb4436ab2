"""Generation engines behind one interface, looked up by name."""

from __future__ import annotations

from actors.engines.base import Engine, Generation

ENGINES = ("transformers",)


def make_engine(name: str, **kwargs) -> Engine:
    """Create the engine ``name`` (one of ``ENGINES``) with its keyword arguments."""
    if name == "transformers":
        from actors.engines.transformers_engine import TransformersEngine

        return TransformersEngine(**kwargs)
    raise ValueError(f"unknown engine {name!r}; available engines: {', '.join(ENGINES)}")


__all__ = ["ENGINES", "Engine", "Generation", "make_engine"]

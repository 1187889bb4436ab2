"""The engine names a config accepts: each registered name and the ``package.module:Class`` it stands for.

The table sits in the lowest layer so that ``sampler.engine`` and ``serve.engine`` are checked when the config
is validated; ``actors.engines`` imports the classes and adds user engines (``register_engine``). Only the
import paths are kept here, as text: nothing in this module imports an engine.
"""

from __future__ import annotations

from agentgym_rl.configs.errors import AgentGymError


class SimulatedEngineError(AgentGymError, ValueError):
    """A simulated engine was given where results must come from a model (an evaluation, a comparison, a stage)."""


# The shipped engines: registered in every process, so a config keeps their short names.
SHIPPED_ENGINES = {
    "transformers": "agentgym_rl.actors.engines.transformers_engine:TransformersEngine",
    "vllm": "agentgym_rl.actors.engines.vllm_engine:VLLMEngine",
    "modelled": "agentgym_rl.actors.engines.modelled:ModelledEngine",
}
# Engines that simulate a model's time without computing it (scale benchmarks): nothing they sample is evidence of
# learning, so evaluations, comparisons and experiment stages refuse them.
SIMULATED_ENGINES = frozenset({"modelled"})

_ENGINES: dict[str, str] = dict(SHIPPED_ENGINES)


def add_engine_target(name: str, target: str) -> None:
    """Record engine ``name`` as the class at ``target`` (``package.module:Class``); a name given again is
    replaced. Use ``actors.engines.register_engine``, which checks the class first."""
    if name in SHIPPED_ENGINES and target != SHIPPED_ENGINES[name]:
        raise ValueError(f"engine name {name!r} is a shipped engine's; register yours under another name")
    _ENGINES[name] = target


def engine_names() -> list[str]:
    """Registered engine names, sorted."""
    return sorted(_ENGINES)


def engine_target(name: str) -> str:
    """The ``package.module:Class`` of engine ``name`` (a registered name, or such a path given directly).

    Raises:
        ValueError: ``name`` is neither, listing the registered names.
    """
    if ":" in name:
        return name
    if name not in _ENGINES:
        raise ValueError(
            f"unknown engine {name!r}; registered engines: {', '.join(engine_names())} "
            "(or give package.module:Class of an actors.engines.Engine subclass)"
        )
    return _ENGINES[name]


def config_engine(name: str) -> str:
    """What a config keeps for engine ``name``: a shipped engine's name as given; a name registered in this
    process as the ``package.module:Class`` it stands for, because samplers and serve replicas run in other
    processes (and a resumed run in another command), which import the class from there; a path as given.

    Raises:
        ValueError: an unknown name, listing the registered names.
    """
    target = engine_target(name)
    return name if name in SHIPPED_ENGINES else target


def refuse_simulated(engine: str, what: str) -> None:
    """Raise :class:`SimulatedEngineError` when ``engine`` (a config's engine setting) is a simulation.

    Args:
        engine: the engine name or path a config keeps.
        what: what refuses it, for the message (``agentgym-rl eval``, ``a compare report``, ...).
    """
    if engine in SIMULATED_ENGINES or engine in {SHIPPED_ENGINES[name] for name in SIMULATED_ENGINES}:
        raise SimulatedEngineError(
            f"{what} refuses engine {engine!r}: it is a simulation (replies drawn, not sampled from a model) for scale "
            "benchmarks only, and no learning or evaluation result may come from it; use engine transformers or vllm"
        )

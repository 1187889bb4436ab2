"""Starting the learner actors of a run: one, or a DeepSpeed group, placed by their resources."""

from __future__ import annotations

import socket

import ray

from agentgym_rl.actors.cluster import actor_gpus
from agentgym_rl.configs import Config
from agentgym_rl.learner.actor import LearnerActor


def start_learners(config: Config, total_updates: int) -> list[ray.actor.ActorHandle]:
    """``learner.count`` learner actors with ``learner.num_cpus``, ``learner.num_gpus`` and ``learner.resources``
    each; rank 0 publishes weights, every rank trains, saves and restores (collectives under DeepSpeed)."""
    cfg = config
    learner_cls = ray.remote(LearnerActor).options(
        num_cpus=cfg.learner.num_cpus,
        num_gpus=actor_gpus(cfg.learner.num_gpus),
        resources=cfg.learner.resources or None,
    )
    master_port = free_port() if cfg.learner.backend == "deepspeed" else 0
    return [
        learner_cls.remote(
            model=cfg.model,
            learner=cfg.learner,
            algorithm=cfg.algorithm,
            seed=cfg.run.seed,
            sampler_dtype=cfg.sampler.dtype,
            total_updates=total_updates,
            rank=rank,
            world_size=cfg.learner.count,
            master_addr="127.0.0.1",
            master_port=master_port,
        )
        for rank in range(cfg.learner.count)
    ]


def free_port() -> int:
    """A free TCP port on 127.0.0.1 for the learners' process group."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def total_updates(config: Config) -> int:
    """The optimizer steps of a whole run, which the learning-rate schedule spans."""
    return config.trainer.iterations * config.learner.epochs * config.learner.minibatches

"""Starting the learner actors of a run: one, or a DeepSpeed group, in one placement group.

Each learner gets a bundle of ``learner.num_cpus`` CPUs, ``learner.num_gpus`` GPUs and ``learner.resources``
(in colocated mode the bundle also holds its sampler's CPUs and resources, and the two share its GPUs);
the bundles are packed onto as few nodes as fit and spread over more when they do not. The process group
meets at rank 0's node: a task in rank 0's bundle reports that node's address and a port free there, and
every rank joins it. Each learner sees only the GPU it reserved (Ray sets ``CUDA_VISIBLE_DEVICES`` per
actor), so its local device is always its first visible one.
"""

from __future__ import annotations

from dataclasses import dataclass

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from agentgym_rl.actors.cluster import ClusterError, Colocation, colocated_bundle, learner_request
from agentgym_rl.actors.weight_sync import free_address
from agentgym_rl.configs import Config
from agentgym_rl.learner.actor import LearnerActor

# How long the learners' bundles may wait for room (the pre-start check already saw that they fit).
PLACEMENT_TIMEOUT_S = 300.0


@dataclass
class LearnerGroup:
    """The learner actors of a run (rank order) and the placement group that holds their resources."""

    actors: list[ray.actor.ActorHandle]
    placement: PlacementGroup
    master_addr: str
    colocation: Colocation | None = None  # colocated mode: the bundles' sampler shares

    def stop(self) -> None:
        """Kill the learners and give their bundles back."""
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        remove_placement_group(self.placement)


def start_learners(config: Config, total_updates: int) -> LearnerGroup:
    """``learner.count`` learner actors, one per bundle; rank 0 publishes weights, every rank trains, saves and
    restores (collectives under DeepSpeed).

    Raises:
        ClusterError: the bundles found no room within ``PLACEMENT_TIMEOUT_S``.
    """
    cfg = config.learner
    colocated = config.trainer.placement == "colocated"
    bundle = colocated_bundle(config) if colocated else learner_request(cfg)  # never empty: learner.num_cpus > 0
    group = placement_group([bundle] * cfg.count, strategy="PACK")
    ready, _ = ray.wait([group.ready()], timeout=PLACEMENT_TIMEOUT_S)
    if not ready:
        remove_placement_group(group)
        raise ClusterError(
            f"the {cfg.count} learner bundle(s) of {bundle} found no room within {PLACEMENT_TIMEOUT_S:g} s "
            "(learner.count, learner.num_cpus, learner.num_gpus, learner.resources"
            f"{'; colocated: sampler.num_cpus, sampler.resources' if colocated else ''})"
        )
    gpus = bundle.get("GPU", 0.0)
    colocation = Colocation(group, cfg.count, gpus / 2) if colocated else None
    master_addr, master_port = "127.0.0.1", 0
    if cfg.backend == "deepspeed":
        in_rank0 = PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=0)
        master_addr, master_port = ray.get(meeting_point.options(scheduling_strategy=in_rank0).remote())
    actors = [
        ray.remote(LearnerActor)
        .options(
            num_cpus=cfg.num_cpus,
            num_gpus=colocation.gpus_each if colocation else gpus,
            resources=cfg.resources or None,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=group, placement_group_bundle_index=rank
            ),
        )
        .remote(
            model=config.model,
            learner=cfg,
            algorithm=config.algorithm,
            seed=config.run.seed,
            sampler_dtype=config.sampler.dtype,
            total_updates=total_updates,
            rank=rank,
            world_size=cfg.count,
            master_addr=master_addr,
            master_port=master_port,
            offload_optimizer=colocated,
        )
        for rank in range(cfg.count)
    ]
    return LearnerGroup(actors, group, master_addr, colocation)


@ray.remote(num_cpus=0)
def meeting_point() -> tuple[str, int]:
    """This node's address and a TCP port free on it: where a learner group's process group meets."""
    return free_address()


def total_updates(config: Config) -> int:
    """The optimizer steps of a whole run, which the learning-rate schedule spans."""
    return config.trainer.iterations * config.learner.epochs * config.learner.minibatches

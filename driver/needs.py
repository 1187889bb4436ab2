"""What a run needs from the cluster at the least, checked before any of its actors starts."""

from __future__ import annotations

from agentgym_rl.actors.cluster import (
    ActorNeed,
    PoolNeed,
    clean_request,
    colocated_bundle,
    env_request,
    learner_request,
    node_capacities,
    plan_actors,
    sampler_request,
)
from agentgym_rl.configs import Config
from agentgym_rl.configs.schema import SamplerConfig
from agentgym_rl.driver.mix import mix_entries


def run_needs(config: Config) -> tuple[list[ActorNeed], list[PoolNeed]]:
    """What ``config``'s run starts at the least: its learners and serve replicas, and per env a sampler
    pool (``sampler.min_count`` samplers with ``sampler.min_envs_per_sampler`` env actors each; offline
    and gateway modes have none)."""
    cfg = config
    colocated = cfg.trainer.placement == "colocated"
    if colocated:
        learners = ActorNeed(
            "learner(s) with their colocated sampler (learner.count, learner.num_cpus + sampler.num_cpus, "
            "learner.num_gpus, learner.resources + sampler.resources)",
            colocated_bundle(cfg),
            cfg.learner.count,
        )
    else:
        learners = ActorNeed(
            "learner(s) (learner.count, learner.num_cpus, learner.num_gpus, learner.resources)",
            learner_request(cfg.learner),
            cfg.learner.count,
        )
    fixed = [learners]
    if cfg.serve.enabled:
        from agentgym_rl.serve.app import replica_gpus  # Ray Serve is imported only by runs that serve

        scaling = cfg.serve.autoscaling
        replicas = scaling.min_replicas if scaling is not None else cfg.serve.num_replicas
        replica = clean_request({"CPU": cfg.serve.num_cpus, "GPU": replica_gpus(cfg.serve)})
        fixed.append(
            ActorNeed("serve replica(s) (serve.num_replicas, serve.num_cpus, serve.num_gpus)", replica, replicas)
        )
    if cfg.trainer.mode in ("offline", "gateway"):
        return fixed, []
    return fixed, [pool_need(entry.name, cfg.sampler, colocated) for entry in mix_entries(cfg)]


def pool_need(env: str, sampler: SamplerConfig, colocated: bool = False) -> PoolNeed:
    """The sampler pool of ``env`` under the ``sampler`` settings: its least and wanted sizes (colocated
    samplers live in the learners' bundles and need nothing more)."""
    return PoolNeed(
        env=env,
        sampler={} if colocated else sampler_request(sampler),
        env_actor=env_request(sampler),
        min_count=sampler.min_count,
        count=sampler.count,
        min_envs=sampler.min_envs_per_sampler,
        envs=sampler.envs_per_sampler,
    )


def plan_run(config: Config) -> list[list[int]]:
    """Check that ``config``'s run fits the cluster before any of its actors starts, and plan its pools: per
    env, the env actor count of each sampler to start (``actors.cluster.plan_actors``).

    Raises:
        ClusterError: the run's minimum does not fit; the message names every number.
    """
    fixed, pools = run_needs(config)
    return plan_actors(node_capacities(), fixed, pools)

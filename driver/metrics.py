"""The per-iteration metrics computed from played episodes: rollout statistics, group counts, pool sums."""

from __future__ import annotations

import ray

from agentgym_rl.actors.trajectory import Trajectory
from agentgym_rl.learner.algorithms import Algorithm


def split_failed(
    refs: list[ray.ObjectRef], trajectories: list[Trajectory]
) -> tuple[list[ray.ObjectRef], list[Trajectory], int]:
    """Drop the episodes whose env failed (they are never trained on); returns the rest and the count."""
    played = [(ref, t) for ref, t in zip(refs, trajectories, strict=True) if not t.failed]
    return [ref for ref, _ in played], [t for _, t in played], len(trajectories) - len(played)


def rollout_metrics(trajectories: list[Trajectory], failed: int = 0) -> dict[str, float]:
    """Episode statistics of the played ``trajectories``; ``failed`` episodes are only counted."""
    n = max(len(trajectories), 1)
    return {
        "rollout/failed": float(failed),
        "success_rate": sum(t.success for t in trajectories) / n,
        "mean_reward": sum(t.reward for t in trajectories) / n,
        "rollout/episodes": float(n),
        "rollout/turns_mean": sum(t.num_turns for t in trajectories) / n,
        "rollout/truncated_rate": sum(t.truncated for t in trajectories) / n,
        "rollout/sampled_tokens": float(sum(t.num_sampled_tokens for t in trajectories)),
        "rollout/episode_tokens_mean": sum(len(t.token_ids) for t in trajectories) / n,
    }


def informative_groups(algorithm: Algorithm, trajectories: list[Trajectory]) -> set[int]:
    """The groups of ``trajectories`` (failed episodes left out) that ``algorithm`` would train on."""
    by_group: dict[int, list[Trajectory]] = {}
    for trajectory in trajectories:
        if not trajectory.failed:
            by_group.setdefault(trajectory.group, []).append(trajectory)
    return {group for group, members in by_group.items() if algorithm.select_trajectories(members)}


def group_metrics(algorithm: Algorithm, trajectories: list[Trajectory]) -> dict[str, float]:
    """``rollout/groups`` played and ``rollout/groups_skipped``: those the algorithm leaves out of the update."""
    groups = {t.group for t in trajectories}
    skipped = len(groups - informative_groups(algorithm, trajectories)) if algorithm.skips_uninformative_groups else 0
    return {"rollout/groups": float(len(groups)), "rollout/groups_skipped": float(skipped)}


def pool_metrics(per_pool: list[dict[str, float]]) -> dict[str, float]:
    """The run's ``pool/*`` metrics: each key summed over the envs' pools (none in a run without samplers)."""
    keys = per_pool[0] if per_pool else {}
    return {key: sum(metrics[key] for metrics in per_pool) for key in keys}

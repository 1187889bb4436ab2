"""Held-out success: a small fixed set of test-split tasks, played once each by the run's own samplers at the
start of the run (before any update) and every ``trainer.heldout_every`` iterations.

Training success is measured on a fresh draw of tasks every iteration, at a horizon the curriculum moves, by a
few episodes: its curve is mostly noise on a short run. The held-out tasks are the same at every measurement,
played from the same seeds (``driver.evaluate.episode_seeds``, as ``agentgym-rl eval --seed <run.seed>`` plays
them) at one turn limit (the curriculum's largest horizon), so two measurements differ by the policy only and
the Wilson interval says how far apart they must be to mean anything.
"""

from __future__ import annotations

import time

import structlog
from rich.progress import Progress

from agentgym_rl.actors.curriculum import largest_horizon
from agentgym_rl.actors.sampler import EpisodeRequest
from agentgym_rl.configs import Config
from agentgym_rl.driver.errors import TrainError
from agentgym_rl.driver.evaluate import EvalError, episode_seeds, pick_tasks, wilson_interval
from agentgym_rl.driver.mix import apportion, env_run_config, mix_entries
from agentgym_rl.driver.samplers import PoolError, SamplerGroup
from agentgym_rl.envs import EnvError, make

log = structlog.get_logger()

# The split the held-out tasks come from; training draws from ``env.split`` (``train`` in the shipped configs).
HELDOUT_SPLIT = "test"


class HeldOutTasks:
    """The run's held-out tasks and their measurements (``trainer.heldout_tasks``, ``trainer.heldout_every``).

    The tasks are read here, before any actor starts: each env of the run gets its share of
    ``trainer.heldout_tasks`` (by its mix weight), evenly spaced over its test split so every task category is
    reached. With ``trainer.heldout_tasks: 0`` nothing is read or played.

    Args:
        config: the resolved run config.
        samplers: the run's sampler group, which plays the tasks (one pool per env, started by the time ``play``
            is first called).
        plays_episodes: whether the run has samplers (``Trainer.plays_episodes``); a run without them skips
            the held-out tasks and says so in a warning.

    Raises:
        TrainError: fewer held-out tasks than envs, an env of the run without a test split, or one with fewer
            test tasks than its share.
    """

    def __init__(self, config: Config, samplers: SamplerGroup, *, plays_episodes: bool = True) -> None:
        self.config = config
        self.samplers = samplers
        self.every = config.trainer.heldout_every
        self.tasks: list[list[int]] = []  # each env's held-out task ids, in env order
        self.horizons: list[int] = []  # each env's turn limit for them
        self.latest: dict[str, float] = {}  # the last measurement's ``heldout/*`` keys
        count = config.trainer.heldout_tasks
        if count and not plays_episodes:
            log.warning("no held-out tasks: this mode plays no episodes", mode=config.trainer.mode, heldout_tasks=count)
        if count == 0 or not plays_episodes:
            return
        entries = mix_entries(config)
        if count < len(entries):
            raise TrainError(
                f"trainer.heldout_tasks={count} cannot give each of the run's {len(entries)} envs a held-out task; "
                f"set it to {len(entries)} or more, or to 0"
            )
        shares = apportion(count, [entry.weight for entry in entries])
        for entry, share in zip(entries, shares, strict=True):
            self.tasks.append(_test_tasks(entry.name, entry.options, share))
            self.horizons.append(largest_horizon(env_run_config(config, entry).curriculum))

    def due(self, iteration: int) -> bool:
        """Whether ``iteration`` starts with a measurement: the first iteration, then every ``heldout_every``."""
        return bool(self.tasks) and iteration % self.every == 0

    def play(self, iteration: int, progress: Progress | None) -> dict[str, float]:
        """Play every held-out task once with the samplers' current weights and sampling settings, when
        ``iteration`` is ``due`` (else nothing).

        Returns:
            the ``heldout/*`` keys of ``iteration``'s metrics record (none when not due): ``success_rate`` (an
            episode whose env failed counts as unsuccessful), its Wilson 95 % interval ``success_low`` and
            ``success_high``, ``episodes``, and ``time/heldout_s``.

        Raises:
            TrainError: a pool lost its last sampler and has no room to start another.
            SamplerFailed: code inside a sampler raised (its env or engine failed).
        """
        if not self.due(iteration):
            return {}
        started = time.perf_counter()
        calls: dict[int, int] = {}  # call -> group
        for env, (env_tasks, horizon) in enumerate(zip(self.tasks, self.horizons, strict=True)):
            for task_id in env_tasks:
                seed, group = episode_seeds(self.config.run.seed, task_id, 1)[0], len(calls)
                request = EpisodeRequest(task_id=task_id, group=group, seed=seed, horizon=horizon)
                calls[self.samplers.submit([request], env=env)] = group
        successes = self._await(calls, iteration, progress)
        low, high = wilson_interval(successes, len(calls))
        self.latest = {
            "heldout/success_rate": successes / len(calls),
            "heldout/success_low": low,
            "heldout/success_high": high,
            "heldout/episodes": float(len(calls)),
        }
        seconds = time.perf_counter() - started
        log.info(
            "held-out tasks played",
            success_rate=round(successes / len(calls), 3),
            interval=[round(low, 3), round(high, 3)],
            episodes=len(calls),
            seconds=round(seconds, 1),
        )
        return {**self.latest, "time/heldout_s": seconds}

    def status(self) -> str:
        """The last measurement for the progress display (empty before the first)."""
        if not self.latest:
            return ""
        return (
            f"held-out {self.latest['heldout/success_rate']:.2f} "
            f"[{self.latest['heldout/success_low']:.2f}, {self.latest['heldout/success_high']:.2f}]"
        )

    def _await(self, calls: dict[int, int], iteration: int, progress: Progress | None) -> int:
        """Wait for the held-out episodes (one a call; a call whose sampler died is played again on a survivor);
        returns how many succeeded."""
        bar = None
        if progress is not None:
            bar = progress.add_task(f"iteration {iteration} held-out tasks", total=len(calls), status="")
        successes = 0
        try:
            for _, _, trajectories in self.samplers.completed(calls, iteration):
                successes += sum(t.success and not t.failed for t in trajectories)
                if bar is not None:
                    progress.advance(bar, 1)
        except PoolError as exc:
            raise TrainError(str(exc)) from exc
        if bar is not None:
            progress.remove_task(bar)
        return successes


def _test_tasks(name: str, options: dict, count: int) -> list[int]:
    """``count`` task ids evenly spaced over env ``name``'s test split."""
    env = make(name, options)
    try:
        tasks = list(env.tasks(HELDOUT_SPLIT))
    except EnvError as exc:
        raise TrainError(
            f"trainer.heldout_tasks plays tasks of the {HELDOUT_SPLIT!r} split, but env {name} has none ({exc}); "
            "set trainer.heldout_tasks=0"
        ) from exc
    finally:
        env.close()
    try:
        return pick_tasks(tasks, count)
    except EvalError:
        raise TrainError(
            f"trainer.heldout_tasks gives env {name} {count} held-out task(s), but its {HELDOUT_SPLIT!r} split has "
            f"{len(tasks)}; lower trainer.heldout_tasks (or raise the env's test tasks in env.options)"
        ) from None

"""The slow tier's rotating shard: each CI run adds one shard of the slow tests that CI would otherwise leave out.

The slow tests not marked ``ci`` are packed into shards of at most ``SHARD_BUDGET_S`` seconds each, by the times
one whole-suite run took on a 2-core machine (``slow_times.json`` beside this file; a test not in it counts
``UNKNOWN_S``). The commit picks the shard: ``HEAD``'s hash modulo the number of shards, so each landing draws a
shard evenly (a count of commits would skip shards whenever landings add the same number of commits, and a
shallow clone has none to count). The chosen tests get the ``shard`` marker, which the CI command selects with
``-m "not slow or ci or shard"``.

A test longer than the budget is in no shard (a shard holding it would push CI past its time): it runs only in
the whole slow tier, ``pytest -m slow``, and the run's closing line names how many such tests there are.

``AGENTGYM_SLOW_SHARD`` overrides the choice: a shard number, or ``off`` for none.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

TIMES = Path(__file__).with_name("slow_times.json")
SHARD_BUDGET_S = 375.0  # one shard's tests, run one after another; on three workers about 2 min of the CI run
UNKNOWN_S = 120.0  # a slow test with no measured time yet


def pack(times: dict[str, float], budget: float) -> list[list[str]]:
    """Split the tests of ``times`` (test id -> seconds, none over ``budget``) into the fewest shards the greedy
    packing needs so that no shard exceeds ``budget``: longest first, each into the shard with the least time so
    far that still has room. The result depends on ``times`` alone."""
    if not times:
        return []
    if too_long := [test for test, seconds in times.items() if seconds > budget]:
        raise ValueError(f"{too_long} take longer than the shard budget of {budget:g} s")
    ordered = sorted(times, key=lambda test: (-times[test], test))
    count = max(1, -(-int(sum(times.values())) // int(budget)))  # ceil: the fewest shards the total allows
    while True:
        shards: list[list[str]] = [[] for _ in range(count)]
        loads = [0.0] * count
        for test in ordered:
            room = [i for i in range(count) if loads[i] + times[test] <= budget]
            if not room:
                break
            best = min(room, key=lambda i: (loads[i], i))
            shards[best].append(test)
            loads[best] += times[test]
        else:
            return [sorted(shard) for shard in shards if shard]
        count += 1


def head_commit(root: Path) -> str | None:
    """The hash of ``HEAD`` of the git checkout at ``root``, or None outside one."""
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=30, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def chosen_shard(count: int, root: Path) -> tuple[int | None, str]:
    """The shard this run adds (None for none) out of ``count``, and why."""
    override = os.environ.get("AGENTGYM_SLOW_SHARD")
    if override == "off" or count == 0:
        return None, "AGENTGYM_SLOW_SHARD=off" if count else "no slow test outside the CI tier"
    if override is not None:
        if not override.isdigit() or int(override) >= count:
            raise pytest.UsageError(f"AGENTGYM_SLOW_SHARD={override}: give a shard from 0 to {count - 1}, or off")
        return int(override), "AGENTGYM_SLOW_SHARD"
    commit = head_commit(root)
    if commit is None:
        return 0, "not a git checkout"
    return int(commit, 16) % count, f"commit {commit[:12]}"


def mark_shard(config: pytest.Config, items: list[pytest.Item]) -> str:
    """Give this run's shard of the slow tests outside the CI tier the ``shard`` marker; returns the line the run
    closes with (``tests/conftest.py`` prints it)."""
    measured = json.loads(TIMES.read_text())["seconds"] if TIMES.exists() else {}
    outside = [item for item in items if item.get_closest_marker("slow") and not item.get_closest_marker("ci")]
    times = {item.nodeid: float(measured.get(item.nodeid, UNKNOWN_S)) for item in outside}
    too_long = sorted(test for test, seconds in times.items() if seconds > SHARD_BUDGET_S)
    for test in too_long:
        del times[test]
    shards = pack(times, SHARD_BUDGET_S)
    index, why = chosen_shard(len(shards), config.rootpath)
    unsharded = f"; {len(too_long)} slow tests longer than {SHARD_BUDGET_S:g} s run only in `pytest -m slow`"
    if index is None:
        return f"slow shard: none ({why}){unsharded}"
    chosen = set(shards[index])
    for item in outside:
        if item.nodeid in chosen:
            item.add_marker("shard")
    seconds = sum(times[test] for test in chosen)
    return f"slow shard: {index} of {len(shards)} ({why}): {len(chosen)} tests, {seconds:.0f} s as measured{unsharded}"

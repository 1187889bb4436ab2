"""The slow tier's rotating shard (tests/slow_shard.py): every slow test in exactly one shard, each within budget."""

import subprocess

import pytest

from tests.slow_shard import chosen_shard, pack


def test_every_test_lands_in_one_shard_within_the_budget():
    times = {f"t{i}": float(s) for i, s in enumerate([500, 400, 300, 300, 200, 120, 90, 60, 30, 30, 10])}
    shards = pack(times, 600)
    assert sorted(test for shard in shards for test in shard) == sorted(times)
    assert all(sum(times[test] for test in shard) <= 600 for shard in shards)
    assert len(shards) == 4  # 2040 s: the 4 shards the total needs at the least suffice here
    assert pack(dict(reversed(times.items())), 600) == shards  # the order of the measurements does not matter


def test_a_test_longer_than_the_budget_is_refused_and_nothing_packs_into_nothing():
    with pytest.raises(ValueError, match="longer than the shard budget of 600 s"):
        pack({"long": 900.0, "a": 100.0}, 600)
    assert pack({}, 600) == []


def test_the_commit_picks_the_shard_unless_overridden(tmp_path, monkeypatch):
    monkeypatch.delenv("AGENTGYM_SLOW_SHARD", raising=False)
    assert chosen_shard(5, tmp_path) == (0, "not a git checkout")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(
        ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "x"],
        check=True,
    )  # fmt: skip
    head = subprocess.run(
        ["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert chosen_shard(5, tmp_path) == (int(head, 16) % 5, f"commit {head[:12]}")
    monkeypatch.setenv("AGENTGYM_SLOW_SHARD", "3")
    assert chosen_shard(5, tmp_path) == (3, "AGENTGYM_SLOW_SHARD")
    monkeypatch.setenv("AGENTGYM_SLOW_SHARD", "off")
    assert chosen_shard(5, tmp_path)[0] is None
    monkeypatch.setenv("AGENTGYM_SLOW_SHARD", "5")
    with pytest.raises(pytest.UsageError, match="give a shard from 0 to 4, or off"):
        chosen_shard(5, tmp_path)

"""The documented command that brings a stage's adapter weights back from git history (docs/results/babyai.md)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors import safe_open

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "docs" / "results" / "restore_adapter.py"
MANIFEST = REPO / "docs" / "results" / "adapters.sha256"
SFT = "docs/results/babyai/sft/adapter/adapter_model.safetensors"
REMOVED = "docs/results/babyai/grpo_fixed_long/adapter/adapter_model.safetensors"
STAGES = [
    "babyai/gigpo_stepwise",
    "babyai/grpo_fixed_long",
    "babyai/grpo_fixed_short",
    "babyai/grpo_stepwise",
    "babyai/sft",
    "babyai_tools/gateway",
    "babyai_tools/grpo_fixed_short",
    "babyai_tools/sft",
    "gateway",
    "search/gigpo_stepwise",
    "search/grpo_fixed_long",
    "search/grpo_fixed_short",
    "search/grpo_stepwise",
    "search/sft",
    "textcraft/grpo_fixed",
    "textcraft/sft",
]


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True).stdout.strip()


def recorded_sha256(path: str) -> str:
    [digest] = [line.split()[0] for line in MANIFEST.read_text().splitlines() if line.split()[1] == path]
    return digest


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """A clone of this repository that shares its objects: the command writes there, never into this tree."""
    if not git(REPO, "log", "-1", "--format=%H", "--diff-filter=AM", "--", REMOVED):
        assert git(REPO, "rev-parse", "--is-shallow-repository") == "true", f"no commit has {REMOVED}"
        pytest.skip(f"a shallow clone without the history that holds {REMOVED} (CI uses a full clone)")
    subprocess.run(["git", "clone", "--quiet", "--shared", str(REPO), str(tmp_path / "clone")], check=True)
    return tmp_path / "clone"


def restore(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], check=False, cwd=root, capture_output=True, text=True)


def test_a_removed_stage_comes_back_as_its_committed_bytes(clone: Path):
    target = clone / REMOVED
    assert not target.exists(), "the stage's weights are out of the tracked tree"

    done = restore(clone, "babyai/grpo_fixed_long")

    assert done.returncode == 0, done.stderr
    assert sha256(target) == recorded_sha256(REMOVED)
    # the newest version git's history records for the path: the old side of its deletion
    newest = git(REPO, "log", "-1", "--raw", "--no-abbrev", "--no-renames", "--format=", "--", REMOVED).split()
    last_blob = [blob for blob in newest[2:4] if blob.strip("0")][-1]
    assert git(clone, "hash-object", str(target)) == last_blob
    with safe_open(str(target), framework="pt") as restored, safe_open(str(REPO / SFT), framework="pt") as sft:
        keys = sorted(restored.keys())
        assert keys == sorted(sft.keys()), "the same peft layout as the SFT adapter it was trained from"
        assert all(k.startswith("base_model.model.") and k.endswith((".lora_A.weight", ".lora_B.weight")) for k in keys)
        assert all(restored.get_slice(k).get_shape() == sft.get_slice(k).get_shape() for k in keys)
    assert git(clone, "status", "--porcelain") == "", "a restored file stays out of git status"


def test_an_unknown_stage_is_refused_with_the_stages():
    done = restore(REPO, "grpo")  # refused before it reads any history or writes anything

    assert done.returncode == 2
    assert "no stage 'grpo'; the recorded stages: " + ", ".join(STAGES) in done.stderr


def test_a_stage_name_only_one_experiment_has_is_enough(clone: Path):
    removed = "docs/results/textcraft/grpo_fixed/adapter/adapter_model.safetensors"
    assert not (clone / removed).exists()

    done = restore(clone, "grpo_fixed")

    assert done.returncode == 0, done.stderr
    assert sha256(clone / removed) == recorded_sha256(removed)


def test_a_stage_name_several_experiments_have_is_refused_with_them():
    done = restore(REPO, "grpo_fixed_long")  # refused before it reads any history or writes anything

    assert done.returncode == 2
    assert "several stages are called 'grpo_fixed_long': babyai/grpo_fixed_long, search/grpo_fixed_long" in done.stderr


def test_the_manifest_records_the_tracked_sft_adapter():
    assert sha256(REPO / SFT) == recorded_sha256(SFT)
    paths = [Path(line.split()[1]).parents[1] for line in MANIFEST.read_text().splitlines()]
    assert sorted(path.relative_to("docs/results").as_posix() for path in paths) == STAGES


def test_a_part_checkpoint_taken_out_of_the_tree_comes_back_from_its_listing(tmp_path: Path):
    """What run_stage.sh does with a stage part: its checkpoint committed once, then removed from the tree, and
    restored from history by the sha256sum listing beside it."""
    repo = tmp_path / "repo"
    part = repo / "docs" / "results" / "textcraft" / "grpo_fixed" / "part"
    (part / "checkpoint" / "policy").mkdir(parents=True)
    files = {"checkpoint/trainer.json": b'{"iteration": 7}', "checkpoint/policy/adapter.bin": bytes(range(256)) * 64}
    for name, data in files.items():
        (part / name).write_bytes(data)
    listing = [f"{hashlib.sha256(data).hexdigest()}  {(part / name).relative_to(repo)}" for name, data in files.items()]
    (part / "checkpoint.sha256").write_text("\n".join(listing) + "\n")
    git(tmp_path, "init", "-q", str(repo))
    for step in (["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "part"]):
        git(repo, *step)
    git(repo, "rm", "-r", "-q", "--cached", str(part / "checkpoint"))
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "checkpoint to history")
    for name in files:
        (part / name).unlink()

    listed = part.relative_to(repo) / "checkpoint.sha256"
    done = restore(repo, "--files", str(listed))

    assert done.returncode == 0, done.stderr
    assert all((part / name).read_bytes() == data for name, data in files.items())

    (part / "checkpoint.sha256").write_text(listing[0].replace(listing[0][:64], "0" * 64) + "\n")
    done = restore(repo, "--files", str(listed))
    assert done.returncode == 1 and f"but {listed} records {'0' * 64}" in done.stderr

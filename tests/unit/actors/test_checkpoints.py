"""A checkpoint's manifest and the check before a resume: every damaged part is named, with or without a manifest,
and a run can go back to an earlier checkpoint."""

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from agentgym_rl.actors.checkpoints import MANIFEST, CheckpointError, checkpoint_damage, write_manifest
from agentgym_rl.actors.rundir import RunDir, latest_if_run

ADAPTER = "policy/adapter_model.safetensors"


def write_parts(folder: Path) -> None:
    """What a LoRA learner and the trainer write into a checkpoint, in their real formats."""
    (folder / "policy").mkdir(parents=True)
    save_file({"lora_A": torch.ones(8, 4), "lora_B": torch.zeros(4, 8)}, folder / ADAPTER)
    (folder / "policy" / "adapter_config.json").write_text(json.dumps({"r": 4}))
    torch.save({"version": 3, "optimizer": {"state": torch.arange(64.0)}}, folder / "learner.pt")
    (folder / "trainer.json").write_text(json.dumps({"iterations_done": 2, "envs": {"babyai": {}}}))


def truncate(name: str, keep: float = 0.5) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        data = (folder / name).read_bytes()
        (folder / name).write_bytes(data[: int(len(data) * keep)])

    return damage


def flip_last_byte(folder: Path) -> None:
    data = bytearray((folder / "learner.pt").read_bytes())
    data[-1] ^= 0xFF
    (folder / "learner.pt").write_bytes(bytes(data))


# damage -> what the message names, with a manifest and without one (None: that check cannot see it)
DAMAGES = {
    "learner.pt emptied": (truncate("learner.pt", 0), "learner.pt has 0 bytes", "learner.pt is not a whole"),
    "learner.pt truncated": (truncate("learner.pt"), "learner.pt has", "learner.pt is not a whole"),
    "learner.pt missing": (lambda f: (f / "learner.pt").unlink(), "learner.pt is missing", "learner.pt is missing"),
    "learner.pt altered": (flip_last_byte, "learner.pt differs", None),
    "adapter truncated": (truncate(ADAPTER), f"{ADAPTER} has", f"{ADAPTER} has"),
    "adapter emptied": (truncate(ADAPTER, 0), f"{ADAPTER} has 0 bytes", f"{ADAPTER} is truncated"),
    "trainer.json truncated": (truncate("trainer.json"), "trainer.json has", "trainer.json is not readable JSON"),
    "trainer.json emptied": (truncate("trainer.json", 0), "trainer.json has 0", "trainer.json is not readable JSON"),
    "trainer.json not a state": (
        lambda f: (f / "trainer.json").write_text("[]"),
        "trainer.json has 2 bytes",
        "trainer.json lacks the iterations done",
    ),
    "policy folder missing": (
        lambda f: shutil.rmtree(f / "policy"),
        "the folder policy/ is missing",
        "the folder policy/ is missing",
    ),
    "adapter config truncated": (
        truncate("policy/adapter_config.json"),
        "policy/adapter_config.json has",
        "policy/adapter_config.json is not readable JSON",
    ),
}


@pytest.mark.parametrize("manifest", [True, False], ids=["manifest", "written-before-manifests"])
@pytest.mark.parametrize("case", list(DAMAGES))
def test_each_damaged_part_is_named(case: str, manifest: bool, tmp_path: Path):
    damage, with_manifest, without_manifest = DAMAGES[case]
    folder = tmp_path / "iter_000002"
    write_parts(folder)
    if manifest:
        write_manifest(folder)
    assert checkpoint_damage(folder) is None
    damage(folder)
    named = with_manifest if manifest else without_manifest
    if named is None:
        assert checkpoint_damage(folder) is None  # what only a hash can see
    else:
        assert named in checkpoint_damage(folder)


def test_the_manifest_lists_every_file_with_its_size_and_hash(tmp_path: Path):
    write_parts(tmp_path)
    files = json.loads(write_manifest(tmp_path).read_text())["files"]
    assert sorted(files) == ["learner.pt", "policy/adapter_config.json", ADAPTER, "trainer.json"]
    assert files["learner.pt"]["bytes"] == (tmp_path / "learner.pt").stat().st_size
    assert len(files[ADAPTER]["sha256"]) == 64
    (tmp_path / MANIFEST).write_text('{"files": {"learner.pt": ')
    assert "manifest.json is not readable" in checkpoint_damage(tmp_path)


def run_with_checkpoints(root: Path, *iterations: int) -> RunDir:
    run = RunDir(root / "run")
    run.checkpoints.mkdir(parents=True, exist_ok=True)
    for n in iterations:
        staging = run.staging_dir(n)
        write_parts(staging)
        (staging / "trainer.json").unlink()  # publish_checkpoint writes it
        run.publish_checkpoint(staging, n, {"iterations_done": n, "envs": {}})
    return run


def test_a_damaged_latest_checkpoint_names_the_one_before(tmp_path: Path):
    run = run_with_checkpoints(tmp_path, 1, 2)
    assert run.resume_checkpoint() == run.checkpoint_dir(2)
    truncate("learner.pt")(run.checkpoint_dir(2))
    with pytest.raises(CheckpointError, match=r"iter_000002 is damaged: learner.pt has .* --from iter_000001$"):
        run.resume_checkpoint()
    assert run.resume_checkpoint("iter_000001") == run.checkpoint_dir(1)
    assert run.resume_checkpoint("1") == run.resume_checkpoint(str(run.checkpoint_dir(1))) == run.checkpoint_dir(1)
    with pytest.raises(CheckpointError, match="--from iter_3: not a complete checkpoint .* iter_000001, iter_000002"):
        run.resume_checkpoint("iter_3")


def test_the_only_checkpoint_damaged_says_there_is_none_before(tmp_path: Path):
    run = run_with_checkpoints(tmp_path, 4)
    truncate("trainer.json", 0)(run.checkpoint_dir(4))
    with pytest.raises(CheckpointError, match="trainer.json has 0 bytes.*no earlier checkpoint"):
        run.resume_checkpoint()
    assert RunDir(tmp_path / "fresh").resume_checkpoint() is None


def test_going_back_sets_the_newer_checkpoints_aside(tmp_path: Path):
    run = run_with_checkpoints(tmp_path, 1, 2, 3)
    moved = run.set_aside_after(run.checkpoint_dir(1))
    assert [p.relative_to(run.checkpoints).as_posix() for p in moved] == [
        "superseded/iter_000002",
        "superseded/iter_000003",
    ]
    assert run.latest_checkpoint() == run.checkpoint_dir(1)
    # the resumed run writes iteration 2 again, and is sent back once more: both copies are kept
    run_with_checkpoints(tmp_path, 2)
    again = run.set_aside_after(run.checkpoint_dir(1))
    assert [p.name for p in again] == ["iter_000002.1"]
    assert sorted(p.name for p in (run.checkpoints / "superseded").iterdir()) == [
        "iter_000002",
        "iter_000002.1",
        "iter_000003",
    ]


def test_eval_serve_and_export_get_a_checked_policy(tmp_path: Path):
    """``latest_if_run`` (what they resolve a checkpoint with) checks the policy's files, and only those."""
    run = run_with_checkpoints(tmp_path, 1, 2)
    (run.path / "config.yaml").write_text("{}")
    assert latest_if_run(run.path) == run.checkpoint_dir(2)
    truncate("learner.pt")(run.checkpoint_dir(2))  # not read by eval, serve or export
    assert latest_if_run(run.path) == run.checkpoint_dir(2)
    truncate(ADAPTER)(run.checkpoint_dir(2))
    with pytest.raises(CheckpointError, match=f"iter_000002 is damaged: {ADAPTER} has"):
        latest_if_run(run.path)
    (run.checkpoint_dir(1) / MANIFEST).unlink()  # written before manifests
    assert latest_if_run(run.checkpoint_dir(1)) == run.checkpoint_dir(1)
    shutil.rmtree(run.checkpoint_dir(1) / "policy")
    with pytest.raises(CheckpointError, match="iter_000001 is damaged: the folder policy/ is missing"):
        latest_if_run(run.checkpoint_dir(1))
    assert latest_if_run(tmp_path) == tmp_path  # neither a run nor a checkpoint: a model directory, say

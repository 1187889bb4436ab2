"""The run directory is absolute before any actor is given it (driver/run.py), and a checkpoint that lacks, where
the driver reads it, a file a learner wrote stops the run naming that learner's node (driver/learner_group.py)."""

from pathlib import Path

import pytest

from agentgym_rl.actors.checkpoints import written_files
from agentgym_rl.actors.rundir import CONFIG_FILE
from agentgym_rl.configs import load_config
from agentgym_rl.driver.errors import TrainError
from agentgym_rl.driver.learner_group import LearnerFiles, check_visible
from agentgym_rl.driver.run import prepare_run
from tests.factories import RECIPE


def test_a_relative_run_dir_is_made_absolute_against_the_drivers_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config, run_dir = prepare_run(RECIPE, ["run.dir=runs", "run.name=here"], None)
    assert run_dir.path == tmp_path / "runs" / "here"
    assert load_config(run_dir.path / CONFIG_FILE).run.dir == config.run.dir == str(tmp_path / "runs")
    _, resumed = prepare_run(None, [], "runs/here")
    assert resumed.path == run_dir.path


def test_a_checkpoint_stops_the_run_when_the_driver_lacks_a_file_a_learner_wrote(tmp_path: Path):
    folder = tmp_path / "iter_000001"
    (folder / "policy").mkdir(parents=True)
    (folder / "policy" / "model.safetensors").write_bytes(b"w" * 8)
    (folder / "learner.pt").write_bytes(b"s" * 4)
    shared = LearnerFiles("a" * 56, "10.0.0.2", written_files(folder))
    check_visible(folder, [shared])  # the driver sees what the learner wrote: nothing to say

    # A learner on a node whose run.dir is its own disk: a file the driver lacks, one of another size.
    apart = LearnerFiles(
        "b" * 56, "10.0.0.3", {"learner.pt": 4, "deepspeed/rank_1.pt": 9, "policy/model.safetensors": 7}
    )
    with pytest.raises(TrainError) as raised:
        check_visible(folder, [shared, apart, apart])  # two learners on that node: each file named once
    message = str(raised.value)
    assert f"node 10.0.0.3 (id {'b' * 56}): deepspeed/rank_1.pt and 1 more" in message
    assert "10.0.0.2" not in message
    assert "run.dir must be on a filesystem that every node shares" in message

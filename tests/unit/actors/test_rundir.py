import json

from agentgym_rl.actors.rundir import TRAINER_STATE, RunDir


def _complete(run: RunDir, n: int) -> None:
    staging = run.staging_dir(n)
    (staging / "learner.pt").write_bytes(b"x")
    run.publish_checkpoint(staging, n, {"iterations_done": n})


def test_partial_checkpoints_are_never_picked_and_retention_keeps_the_newest(tmp_path):
    run = RunDir(tmp_path / "run")
    run.checkpoints.mkdir(parents=True)
    for n in (2, 4, 6):
        _complete(run, n)
    run.staging_dir(8)  # a write that was killed: hidden staging folder
    (run.checkpoints / "iter_000010").mkdir()  # a folder without trainer state
    assert run.latest_checkpoint().name == "iter_000006"
    assert json.loads((run.latest_checkpoint() / TRAINER_STATE).read_text())["iterations_done"] == 6
    removed = run.prune_checkpoints(2)
    assert [p.name for p in removed] == ["iter_000002"]
    assert [p.name for p in run.complete_checkpoints()] == ["iter_000004", "iter_000006"]
    assert run.prune_checkpoints(0) == []


def test_keep_metrics_before_drops_redone_iterations(tmp_path):
    run = RunDir(tmp_path / "run")
    run.path.mkdir(parents=True)
    for i in range(5):
        run.append_metrics({"iteration": i})
    run.keep_metrics_before(3)
    assert [r["iteration"] for r in run.read_metrics()] == [0, 1, 2]

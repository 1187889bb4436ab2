"""A tiny training run with logging.wandb on writes an offline W&B run holding its metrics.

The offline run is read back from its ``run-*.wandb`` file: W&B's record log (LevelDB log framing:
32 KiB blocks of chunks with a 7-byte header ``crc32 | length u16 | type u8``, after a 7-byte file
header), each record a ``wandb_internal_pb2.Record`` protobuf.
"""

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from wandb.proto import wandb_internal_pb2

REPO = Path(__file__).resolve().parents[2]
CLI = Path(sys.executable).parent / "agentgym-rl"
BLOCK = 32768
FULL, LAST = 1, 4


def wandb_records(path: Path) -> list[wandb_internal_pb2.Record]:
    raw = path.read_bytes()
    assert raw[:4] == b":W&B", f"{path} is not a W&B record log"
    records, pending, pos = [], b"", 7
    while pos + 7 <= len(raw):
        if BLOCK - pos % BLOCK < 7:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", raw[pos : pos + 7])
        if kind == 0:
            break
        pending += raw[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def history(records: list[wandb_internal_pb2.Record]) -> list[dict]:
    rows = []
    for record in records:
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {".".join(item.nested_key) or item.key: json.loads(item.value_json) for item in record.history.item}
            )
    return rows


@pytest.mark.slow
def test_tiny_run_writes_offline_wandb_run_with_its_metrics(tmp_path: Path):
    command = [str(CLI)] if CLI.exists() else [sys.executable, "-m", "agentgym_rl.driver.cli"]
    settings = {
        "model.name": "tiny-random",
        "sampler.sampling.max_new_tokens": "8",
        "trainer.iterations": "2",
        "trainer.tasks_per_iteration": "1",
        "trainer.checkpoint_every": "2",
        "algorithm.group_size": "3",
        # tiny-random never succeeds: every group is uniform, which GRPO would otherwise skip (no update)
        "algorithm.skip_uniform_groups": "false",
        "curriculum.horizons": "[1, 2]",
        "curriculum.advance_every": "1",
        "logging.progress": "false",
        "warm_start.iterations": "0",
        "logging.wandb.enabled": "true",
        "logging.wandb.project": "agentgym-rl-test",
        "logging.wandb.episodes_per_iteration": "2",
        "run.dir": str(tmp_path / "runs"),
        "run.name": "wb",
    }
    sets = [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_") and k != "RAY_ADDRESS"}
    result = subprocess.run(
        [*command, "train", str(REPO / "configs" / "warm_start_grpo.yaml"), *sets],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]

    run_dir = tmp_path / "runs" / "wb"
    offline = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(offline) == 1, "logging.wandb.dir defaults to the run directory"
    records = wandb_records(next(offline[0].glob("run-*.wandb")))

    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert run.project == "agentgym-rl-test" and run.display_name == "wb"
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["model"]["name"] == "tiny-random" and config["logging"]["wandb"]["mode"] == "offline"

    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    logged = history(records)
    assert [row["_step"] for row in logged] == [0, 1]
    for row, record in zip(logged, metrics, strict=True):
        for key in ("success_rate", "mean_reward", "horizon", "learner/loss", "weights_version"):
            assert row[key] == pytest.approx(record[key]), key
        assert row["episodes._type"] == "table-file" and row["episodes.nrows"] == 2
        assert (offline[0] / "files" / row["episodes.path"]).is_file()
    # The stepwise schedule moves from horizon 1 to 2 at iteration 1: both starts are logged as changes.
    assert [row.get("curriculum/horizon_change") for row in logged] == [1, 2]

    table = json.loads((offline[0] / "files" / logged[1]["episodes.path"]).read_text())
    assert table["columns"][:3] == ["iteration", "env", "task_id"]
    assert {row[0] for row in table["data"]} == {1}

    exits = [r.exit for r in records if r.WhichOneof("record_type") == "exit"]
    assert len(exits) == 1 and exits[0].exit_code == 0

"""benchmarks/gpu_check.py on the CPU with tiny shapes, as a bare GPU machine would run it: without Ray, vLLM,
DeepSpeed or the GGUF reader, every section written to its JSON file."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# A None entry in sys.modules makes the import fail and importlib's find_spec answer None, as where the
# package is not installed; then the check runs as a script, as on the GPU machine.
WITHOUT_CLUSTER_PACKAGES = """
import runpy, sys
for name in ("ray", "vllm", "deepspeed", "gguf", "wandb"):
    sys.modules[name] = None
sys.argv = ["benchmarks/gpu_check.py", *sys.argv[1:]]
runpy.run_path("benchmarks/gpu_check.py", run_name="__main__")
"""

SECTIONS = ("env", "learner", "agreement", "engine", "logprobs", "publish", "transport", "learner_7b")


@pytest.mark.slow
@pytest.mark.ci
def test_the_gpu_check_runs_on_the_cpu_without_ray_and_writes_every_section(tmp_path):
    out = tmp_path / "gpu_check.json"
    result = subprocess.run(
        [sys.executable, "-c", WITHOUT_CLUSTER_PACKAGES, "--device", "cpu", "--quick", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["finished"] and report["errors"] == {}, report["errors"]
    sections = report["sections"]
    assert set(SECTIONS) <= set(sections)
    assert sections["env"]["device"] == "cpu" and sections["env"]["quick"] is True

    for name, row in sections["learner"].items():
        assert row["tokens_per_s"] > 0 and row["grad_norm"] > 0, (name, row)
    # the same weights and batch, float32: one device against itself here, the GPU against the CPU there
    assert sections["agreement"]["within_rtol"]

    engine = sections["engine"]
    assert engine["same_seeds_rows_identical"] == 1.0
    assert engine["turn2_reused_tokens"] > 0 and engine["turn2_rows_identical_reuse_vs_full_prefill"] == 1.0
    assert engine["logprobs_finite"]
    # float32 engine against the bf16-mixed learner (the CPU tier): close, not equal
    assert 0 < sections["logprobs"]["tokens"] and sections["logprobs"]["max"] < 0.1

    publish = sections["publish"]
    assert publish["publish_lora_bytes"] < publish["publish_full_bytes"]
    transport = sections["transport"]
    assert transport["learner_and_engine_on_this_device"] == "gloo" and transport["cpu_ends"] == "gloo"


@pytest.mark.slow
def test_the_gpu_checks_deepspeed_and_vllm_sections_run_where_those_import(tmp_path):
    out = tmp_path / "gpu_check.json"
    result = subprocess.run(
        [sys.executable, "benchmarks/gpu_check.py", "--device", "cpu", "--quick", "--sections", "env,deepspeed,vllm"]
        + ["--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["errors"] == {}, report["errors"]
    section = report["sections"]["deepspeed"]
    assert section["update"]["grad_norm"] > 0 and section["update_tokens_per_s"] > 0
    assert section["publish_bytes"] > 0
    # gathered a bucket at a time: never more whole at once than a bucket, or the one parameter larger than it
    assert 0 < section["gathered_peak_bytes"] <= max(section["bucket_bytes"], section["largest_parameter_bytes"])
    assert section["gathered_peak_bytes"] < section["model_bytes"]
    engine = report["sections"]["vllm"]
    assert engine["vllm_tokens_per_s"] > 0 and engine["transformers_generate_tokens_per_s"] > 0
    # each version an adapter by id, sampled from (the tiny shape's rank-16 adapter is no small share of its model)
    for version in (1, 2):
        assert engine[f"adapter_v{version}_bytes_into_engine"] > 0
        assert engine[f"adapter_v{version}_logprobs_finite"]

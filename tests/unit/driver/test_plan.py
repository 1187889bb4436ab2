"""The memory plan: parameter counts against models built from the same configs, the placement and memory of the
documented set-ups, the doc's numbers against the command's, and train refusing a run that cannot fit."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache

from agentgym_rl.actors.architectures import ArchitectureError, Shape, published_shape, read_architecture
from agentgym_rl.actors.model_store import load_model
from agentgym_rl.configs import load_config
from agentgym_rl.configs.schema import LoraConfig
from agentgym_rl.driver.cli import PLAN_DOES_NOT_FIT, main
from agentgym_rl.driver.plan import GIB, Hardware, Holder, Item, check_memory, make_plan, place

REPO = Path(__file__).resolve().parents[3]
SETUPS = ["configs/gpu/one_gpu.yaml", "configs/gpu/one_node_8.yaml", "configs/gpu/two_nodes.yaml"]
# configs/babyai.yaml (Qwen2.5-7B-Instruct) trained with full weights by one torch learner on one GPU
ONE_GPU_7B_FULL = [
    "configs/babyai.yaml",
    "--set",
    "learner.backend=torch",
    "--set",
    "learner.count=1",
    "--set",
    "learner.num_gpus=1",
    "--set",
    "sampler.count=1",
    "--set",
    "sampler.num_gpus=1",
]
GPU_80 = Hardware(gpu_bytes=80 * GIB, gpu_source="test", gpus_per_node=8)


def meta_model(config) -> torch.nn.Module:
    """The model of ``config`` with every tensor on the meta device: shapes without memory."""
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def small(model_type: str, **extra) -> AutoConfig:
    return AutoConfig.for_model(
        model_type,
        vocab_size=320,
        hidden_size=96,
        intermediate_size=160,
        num_hidden_layers=3,
        num_attention_heads=6,
        num_key_value_heads=2,
        **extra,
    )


CONFIGS = {
    "tiny-random": lambda: read_architecture("tiny-random").config,
    "SmolLM2-135M": lambda: published_shape("SmolLM2-135M-Instruct"),
    "Qwen2.5-0.5B": lambda: published_shape("Qwen2.5-0.5B"),
    "Qwen2.5-1.5B": lambda: published_shape("Qwen2.5-1.5B-Instruct"),
    "Qwen2.5-7B": lambda: published_shape("/models/Qwen2.5-7B-Instruct"),
    "llama with biases": lambda: small("llama", attention_bias=True, mlp_bias=True, tie_word_embeddings=False),
    "mistral": lambda: small("mistral", tie_word_embeddings=False),
    "qwen3": lambda: small("qwen3", head_dim=24, tie_word_embeddings=True),
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_parameter_count_is_that_of_the_model_built_from_the_config(name: str):
    config = CONFIGS[name]()
    assert Shape.from_config(config).parameters() == sum(p.numel() for p in meta_model(config).parameters())


@pytest.mark.parametrize("targets", ["all-linear", ["q_proj", "k_proj", "v_proj", "o_proj"], ["down_proj"]])
@pytest.mark.parametrize("name", ["tiny-random", "Qwen2.5-0.5B"])
def test_lora_counts_are_those_peft_adapts(name: str, targets):
    from peft.tuners.lora import LoraLayer

    from agentgym_rl.learner.lora_policy import apply_lora

    config, lora = CONFIGS[name](), LoraConfig(r=8, target_modules=targets)
    shape = Shape.from_config(config)
    model = apply_lora(meta_model(config), lora)
    assert shape.lora_parameters(lora) == sum(p.numel() for p in model.parameters() if p.requires_grad)
    adapted = [module.base_layer.weight for module in model.modules() if isinstance(module, LoraLayer)]
    assert shape.adapted_parameters(lora) == sum(w.numel() for w in adapted)


def test_key_value_bytes_per_token_are_what_the_model_caches():
    model = load_model("tiny-random")
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(torch.arange(10)[None], past_key_values=cache, use_cache=True)
    cached = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    assert Shape.from_config(model.config).kv_bytes_per_token(4) * 10 == cached


def test_an_unknown_architecture_or_lora_target_names_what_the_plan_counts():
    with pytest.raises(ArchitectureError, match="llama, mistral, qwen2, qwen3"):
        Shape.from_config(AutoConfig.for_model("gpt2"))
    with pytest.raises(ArchitectureError, match="lm_head"):
        Shape.from_config(CONFIGS["tiny-random"]()).lora_parameters(LoraConfig(target_modules=["lm_head"]))


def test_a_lora_run_holds_no_reference_copy_and_a_full_run_does():
    shape = Shape.from_config(published_shape("Qwen2.5-7B"))
    lora = load_config(REPO / "configs/gpu/one_gpu.yaml", [])
    full = load_config(REPO / "configs/gpu/one_gpu.yaml", ["learner.lora.enabled=false"])
    for config, copies in ((lora, 0), (full, 1)):
        [holder] = make_plan(config, shape, GPU_80, model="test").holders
        assert sum("reference model" in item.name for item in holder.items) == copies


def test_a_gpu_peaks_at_its_fullest_moment_and_a_phase_at_its_fullest_moment():
    loading, backward, update_end = frozenset({"load"}), frozenset({"update"}), frozenset({"update end"})
    items = [
        Item("kept", 10),
        Item("loaded whole", 6, loading),
        Item("a", 3, backward),
        Item("b", 4, backward),
        Item("gathered", 5, update_end),
    ]
    holder = Holder("test", 1, True, items)
    assert holder.phase_bytes("start-up") == 10 + 6
    assert holder.phase_bytes("update") == 10 + max(3 + 4, 5)
    assert holder.phase_bytes("sync") == 10
    assert (holder.peak, holder.peak_moment) == (10 + 3 + 4, "update")


def test_the_setups_place_their_actors_on_one_and_two_nodes():
    one_gpu, one_node, two_nodes = (load_config(REPO / path, []) for path in SETUPS)
    assert (place(one_gpu, GPU_80).nodes, place(one_gpu, GPU_80).total("GPU")) == (1, 1)
    assert (place(one_node, GPU_80).nodes, place(one_node, GPU_80).total("GPU")) == (1, 8)
    assert (place(two_nodes, GPU_80).nodes, place(two_nodes, GPU_80).total("GPU")) == (2, 16)


@pytest.mark.parametrize("config", ["configs/quickstart.yaml", *SETUPS])
def test_plan_prints_placement_and_memory_and_exits_0_when_it_fits(config: str, capsys):
    assert main(["plan", str(REPO / config), "--gpu-memory-gib", "80", "--gpus-per-node", "8"]) == 0
    out = capsys.readouterr().out
    assert "placement (" in out
    assert re.search(r"^\s+peak: [a-z ,-]+\s+\d+\.\d\d", out, re.MULTILINE)
    assert out.rstrip().splitlines()[-1].startswith("fits:")


def test_plan_of_a_cpu_run_says_no_gpu_is_used(capsys):
    cpu = ["--set", "learner.num_gpus=0", "--set", "sampler.num_gpus=0"]
    assert main(["plan", str(REPO / "configs/quickstart.yaml"), *cpu]) == 0
    out = capsys.readouterr().out
    assert "memory per process (no GPU is used" in out
    assert "learner process: 1 process" in out


def test_a_run_that_cannot_fit_exits_1_naming_its_largest_items(capsys):
    argv = [str(REPO / ONE_GPU_7B_FULL[0]), *ONE_GPU_7B_FULL[1:], "--gpu-memory-gib", "80"]
    assert main(["plan", *argv]) == PLAN_DOES_NOT_FIT
    verdict = capsys.readouterr().out.rstrip().splitlines()[-1]
    assert verdict.startswith("does not fit: each GPU of the learner")
    assert "policy AdamW moments, float32 (56.74 GiB)" in verdict
    small_gpu = ["--set", "learner.num_gpus=1", "--gpu-memory-gib", "1"]
    assert main(["plan", str(REPO / "configs/quickstart.yaml"), *small_gpu]) == PLAN_DOES_NOT_FIT
    out = capsys.readouterr().out
    assert "in the update, a backward, more than its 1.00 GiB" in out
    assert "the largest items then: activations" in out


def test_train_refuses_a_run_that_cannot_fit_before_anything_starts(tmp_path: Path):
    # RAY_TMPDIR is where a Ray instance started by the command would keep its session: none may appear.
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RAY_TMPDIR": str(tmp_path / "ray")}
    argv = [*ONE_GPU_7B_FULL, "--set", f"run.dir={tmp_path / 'runs'}", "--set", "ray.gpu_memory_gib=80"]
    done = subprocess.run(
        [sys.executable, "-m", "agentgym_rl.driver.cli", "train", *argv],
        check=False,
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    assert "the run does not fit in GPU memory" in done.stderr
    assert "policy AdamW moments, float32 (56.74 GiB)" in done.stderr
    assert not (tmp_path / "ray").exists()
    assert not (tmp_path / "runs").exists()


def test_train_never_refuses_a_cpu_run():
    cpu = ["learner.num_gpus=0", "sampler.num_gpus=0", "ray.gpu_memory_gib=0.001", "model.adapter=null"]
    check_memory(load_config(REPO / "configs/quickstart.yaml", cpu))


def doc_plans() -> list[tuple[list[str], str]]:
    """Each ``$ agentgym-rl plan ...`` block of docs/how-to/gpus.md's "Memory plan" section: its arguments and
    the output it shows."""
    page = (REPO / "docs/how-to/gpus.md").read_text()
    section = page.split("\n## Memory plan\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```text\n\$ agentgym-rl (plan [^\n]*)\n(.*?)\n```", section, re.DOTALL)
    return [(command.split(), output) for command, output in blocks]


def test_the_docs_memory_plan_shows_what_the_command_prints(capsys, monkeypatch):
    monkeypatch.chdir(REPO)  # the doc's paths are relative to the repository root
    plans = doc_plans()
    assert [argv[1] for argv, _ in plans] == SETUPS
    for argv, shown in plans:
        main(argv)
        assert capsys.readouterr().out.rstrip("\n") == shown, " ".join(argv)
    # The "Three set-ups" table quotes them: each GiB number of a row is in its set-up's plan.
    page = (REPO / "docs/how-to/gpus.md").read_text()
    table = page.split("\n## Three set-ups\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith(("| one", "| two"))]
    assert len(rows) == len(plans)
    for row, (_, shown) in zip(rows, plans, strict=True):
        quoted = re.findall(r"(\d+\.\d\d) GiB", row)
        assert quoted
        assert all(re.search(rf"\b{re.escape(number)}\b", shown) for number in quoted), row

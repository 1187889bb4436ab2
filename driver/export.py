"""``agentgym-rl export``: a checkpoint's policy as a plain Hugging Face model directory (LoRA adapters merged)."""

from __future__ import annotations

from pathlib import Path

from agentgym_rl.actors.adapters import load_policy, policy_source
from agentgym_rl.actors.model_store import load_tokenizer
from agentgym_rl.configs.errors import AgentGymError
from agentgym_rl.driver.evaluate import resolve_checkpoint


class ExportError(AgentGymError, ValueError):
    """An export target that would overwrite something."""


def export_merged(checkpoint: str, output: str) -> Path:
    """Write the policy of ``checkpoint`` (a run's ``checkpoints/iter_N``, a run directory for its latest
    checkpoint, or a model or adapter directory) to ``output`` as a float32 Hugging Face model directory
    that ``AutoModelForCausalLM.from_pretrained`` loads; a LoRA adapter is merged into its base (whose
    weights hash is checked first). Returns the output directory.

    Raises:
        ExportError: ``output`` exists and is not empty.
        EvalError: ``checkpoint`` holds no policy.
        AdapterError: the adapter's base model is missing or not the one it was trained on.
    """
    target = Path(output).expanduser()
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ExportError(f"--output {output} exists and is not empty; give a new directory")
    _, policy, _ = resolve_checkpoint(checkpoint)
    name, adapter = policy_source(policy)
    model = load_policy(name, adapter)
    model.save_pretrained(target)
    load_tokenizer(name).save_pretrained(target)
    return target

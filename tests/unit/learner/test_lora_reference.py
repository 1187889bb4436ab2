"""A LoRA run's reference is its own policy with the starting adapter (or none) in place of the trained one: the
base weights are held once, in the compute dtype, and the reference scores as a separately loaded model did."""

import pytest
import torch

from agentgym_rl.actors.adapters import load_policy, read_adapter
from agentgym_rl.actors.model_store import load_model
from agentgym_rl.learner.algorithms.base import LOSS_MASK, OLD_LOGPROBS, REF_LOGPROBS
from agentgym_rl.learner.forward import masked_token_outputs
from agentgym_rl.learner.lora_policy import adapter_state_dict
from tests.unit.learner.helpers import batch_of
from tests.unit.learner.test_learner import LORA, make_learner


def saved_adapter(folder) -> str:
    """A LoRA adapter trained by one SFT update and saved as a checkpoint's policy/."""
    learner = make_learner("sft", *LORA, "learner.lr=0.05")
    learner.update_batch(batch_of())
    learner.save_checkpoint(str(folder / "start"))
    return str(folder / "start" / "policy")


def trainable(model: torch.nn.Module) -> set[str]:
    return {name for name, param in model.named_parameters() if param.requires_grad}


@pytest.mark.parametrize("start", ["base", "starting adapter"])
def test_a_lora_reference_scores_as_a_separately_loaded_reference(tmp_path, start):
    adapter = saved_adapter(tmp_path) if start == "starting adapter" else None
    extra = [f"model.adapter={adapter}"] if adapter else []
    learner = make_learner("grpo", *LORA, *extra, "learner.lr=0.05", "learner.old_logprobs=recompute")
    assert learner.reference is None and learner.reference_source == start
    learner.update_batch(batch_of())  # the trained adapter moves away from the start
    before = trainable(learner.policy)
    batch = learner.prepare(batch_of(seed=1))
    with torch.no_grad():
        separate = load_policy("tiny-random", adapter, "float32")
        expected = masked_token_outputs(
            separate, batch["input_ids"], batch["attention_mask"], batch[LOSS_MASK], entropy=False
        )["logprobs"]
    assert torch.allclose(batch[REF_LOGPROBS], expected, atol=1e-5)
    # the policy itself scores otherwise: the reference is not simply the current policy
    assert (batch[OLD_LOGPROBS] - expected).abs().max() > 1e-3
    # the trained adapter is active and trainable again, the reference frozen
    assert trainable(learner.policy) == before and all(".default." in name for name in before)
    learner.save_checkpoint(str(tmp_path / "ckpt"))
    policy = tmp_path / "ckpt" / "policy"
    assert not (policy / "reference").exists()
    assert read_adapter(policy).tensors.keys() == adapter_state_dict(learner.policy).keys()


@pytest.mark.parametrize("precision", ["float32", "bf16-mixed"])
def test_a_lora_learner_with_a_reference_holds_one_copy_of_the_base_weights(tmp_path, precision):
    learner = make_learner("grpo", *LORA, f"model.adapter={saved_adapter(tmp_path)}", f"learner.precision={precision}")
    assert learner.algorithm.needs_reference and learner.reference_source == "starting adapter"
    held = [learner.policy, learner.compute_policy] + ([learner.reference] if learner.reference is not None else [])
    storages = {
        param.data_ptr(): param.numel()
        for module in held
        for name, param in module.named_parameters()
        if "lora_" not in name
    }
    assert sum(storages.values()) == sum(param.numel() for param in load_model("tiny-random").parameters())
    base_dtypes = {param.dtype for name, param in learner.policy.named_parameters() if "lora_" not in name}
    assert base_dtypes == {torch.bfloat16 if precision == "bf16-mixed" else torch.float32}
    # the trained adapter keeps float32 master weights
    assert {param.dtype for param in learner.optimizer.param_groups[0]["params"]} == {torch.float32}


def test_a_full_weight_run_keeps_a_reference_model_of_its_own():
    learner = make_learner("grpo")
    assert learner.reference_source == "model" and learner.reference is not None
    assert make_learner("grpo", "algorithm.kl_coef=0").reference_source is None

"""bf16-mixed precision: float32 master weights keep updates that bfloat16 parameters round away."""

import pytest
import torch

from agentgym_rl.actors.engines.transformers_engine import TransformersEngine
from agentgym_rl.actors.weights import pack_state_dict, unpack_state_dict
from agentgym_rl.learner.precision import BFloat16Compute, resolve_precision
from tests.unit.learner.helpers import batch_of
from tests.unit.learner.test_learner import make_learner

# bfloat16 keeps 8 significant bits: next to 1.0 its neighbours are 1 - 2**-8 and 1 + 2**-7.
STEP = 1e-4  # far below both gaps


def test_updates_below_bfloat16_resolution_accumulate_in_the_master_and_reach_the_copy():
    master = torch.nn.Linear(4, 1, bias=False)
    torch.nn.init.ones_(master.weight)
    mixed = BFloat16Compute(master)
    copy = mixed.module.weight
    assert copy.dtype == torch.bfloat16 and master.weight.dtype == torch.float32

    optimizer = torch.optim.SGD(master.parameters(), lr=STEP)
    for step in range(1, 101):
        optimizer.zero_grad()
        copy.float().sum().backward()  # the loss is computed on the bfloat16 copy; its gradient is 1
        mixed.collect_gradients()
        assert copy.grad is None and master.weight.grad is not None
        optimizer.step()
        mixed.copy_weights()
        if step == 1:
            # one step moves the master by 1e-4, which rounds back to 1.0 in bfloat16
            assert torch.allclose(master.weight, torch.full_like(master.weight, 1 - STEP))
            assert torch.equal(copy, torch.ones_like(copy))
    # 100 steps: the master is at 0.99 and the copy has followed it to the nearest bfloat16 below 1
    assert torch.allclose(master.weight, torch.full_like(master.weight, 1 - 100 * STEP), atol=1e-6)
    assert torch.equal(copy, master.weight.detach().to(torch.bfloat16)) and bool((copy < 1).all())

    # the same 100 steps on a plain bfloat16 parameter change nothing at all
    plain = torch.nn.Parameter(torch.ones(1, 4, dtype=torch.bfloat16))
    optimizer = torch.optim.SGD([plain], lr=STEP)
    for _ in range(100):
        optimizer.zero_grad()
        plain.float().sum().backward()
        optimizer.step()
    assert torch.equal(plain.detach(), torch.ones_like(plain))


def test_gradients_of_several_micro_batches_add_up_in_float32():
    master = torch.nn.Linear(3, 1, bias=False)
    mixed = BFloat16Compute(master)
    x = torch.randn(6, 3, generator=torch.Generator().manual_seed(0))
    for part in x.split(2):
        mixed.module(part.bfloat16()).float().sum().backward()
        mixed.collect_gradients()
    assert master.weight.grad.dtype == torch.float32
    assert torch.allclose(master.weight.grad, x.sum(0, keepdim=True), rtol=1e-2)  # d/dw of sum(x w)


def test_a_learner_at_a_tiny_learning_rate_moves_its_master_and_samplers_load_its_bfloat16_copy():
    learner = make_learner(
        "grpo", "learner.precision=bf16-mixed", "learner.lr=1e-7", "algorithm.kl_coef=0", sampler_dtype="bfloat16"
    )
    assert learner.describe()["precision"] == "bf16-mixed"
    assert next(learner.compute_policy.parameters()).dtype == torch.bfloat16
    assert next(learner.policy.parameters()).dtype == torch.float32
    master_before = {k: v.clone() for k, v in learner.policy.state_dict().items()}
    copy_before = {k: v.clone() for k, v in learner.compute_policy.state_dict().items()}
    steps, seed = 0, 0
    while steps < 30:
        steps += int(learner.update_batch(batch_of(seed=seed))["learner/optimizer_steps"])
        seed += 1
    master = learner.policy.state_dict()
    copy = learner.compute_policy.state_dict()
    # AdamW moves each weight by about lr per step: every float32 tensor moves, while 30 steps of 1e-7 stay
    # below bfloat16's resolution for most weights; where the moves add up past it, the copy follows
    assert all(not torch.equal(master_before[k], master[k]) for k in master)
    changed = [k for k in copy if not torch.equal(copy_before[k], copy[k])]
    assert changed
    for key, value in copy.items():
        assert torch.equal(value, master[key].to(value.dtype)), key

    # the payload a bfloat16 sampler loads is exactly the learner's bfloat16 copy
    payload = learner.weights_payload()
    assert set(payload.dtypes.values()) == {"bfloat16"} and payload.version == learner.version == steps
    engine = TransformersEngine(model_name="tiny-random", dtype="bfloat16", seed=0, stop_token_ids=[0], pad_token_id=0)
    loaded_before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    engine.load_weights(payload)
    for key, value in engine.model.state_dict().items():
        assert torch.equal(value, copy[key]), key
    assert any(not torch.equal(loaded_before[k], engine.model.state_dict()[k]) for k in changed)


def test_a_float32_sampler_gets_the_master_weights_themselves():
    learner = make_learner("sft", "learner.precision=bf16-mixed", sampler_dtype="float32")
    learner.update_batch(batch_of())
    unpacked = unpack_state_dict(learner.weights_payload())
    for key, value in learner.policy.state_dict().items():
        assert torch.equal(unpacked[key], value), key


def test_packing_keeps_bfloat16_bits():
    state = {"w": torch.tensor([1.0 - STEP, 0.5, -3.0])}
    payload = pack_state_dict(state, 1, dtype="bfloat16")
    assert payload.dtypes["w"] == "bfloat16"
    assert torch.equal(unpack_state_dict(payload)["w"], state["w"].to(torch.bfloat16))


@pytest.mark.parametrize("value", ["float32", "bf16-mixed"])
def test_explicit_precision_is_kept(value):
    assert resolve_precision(value, torch.device("cpu")) == value

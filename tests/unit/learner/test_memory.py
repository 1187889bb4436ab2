"""What the learner holds: no float32 copy made for its bfloat16 one, no gradients between updates, no entropy
graph the loss does not read."""

import contextlib

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from agentgym_rl.actors.model_store import load_model
from agentgym_rl.learner.forward import masked_token_outputs
from agentgym_rl.learner.precision import BFloat16Compute
from tests.unit.learner.helpers import batch_of
from tests.unit.learner.test_learner import LORA, make_learner


@contextlib.contextmanager
def saved_shapes():
    """A list that every tensor autograd saves for the backward inside the context appends its shape to."""
    shapes: list[torch.Size] = []

    def pack(tensor):
        shapes.append(tensor.shape)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        yield shapes


def vocabulary_wide(shapes: list[torch.Size], vocab: int) -> list[torch.Size]:
    return [shape for shape in shapes if len(shape) > 0 and shape[-1] == vocab]


class Allocations(TorchDispatchMode):
    """Bytes of every new tensor that an op makes inside the context (views and in-place results are not new),
    by dtype."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes: dict[torch.dtype, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        schema = func._schema
        if not schema.is_mutable and not any(value.alias_info for value in schema.returns):
            for tensor in tree_leaves(out):
                if isinstance(tensor, torch.Tensor):
                    size = tensor.numel() * tensor.element_size()
                    self.bytes[tensor.dtype] = self.bytes.get(tensor.dtype, 0) + size
        return out


def test_the_bfloat16_copy_is_made_without_a_float32_copy_first():
    master = torch.nn.ModuleDict({"policy": load_model("tiny-random")})
    weights = sum(param.numel() for param in master.parameters())
    with Allocations() as made:
        mixed = BFloat16Compute(master)
    assert made.bytes[torch.bfloat16] == 2 * weights
    others = sum(size for dtype, size in made.bytes.items() if dtype != torch.bfloat16)  # buffers only
    assert others < 0.01 * 4 * weights, made.bytes
    assert all(param.dtype == torch.bfloat16 for param in mixed.module.parameters())


@pytest.mark.parametrize(
    "overrides",
    [
        ["algorithm.entropy_coef=0.01"],
        ["learner.precision=bf16-mixed"],
        [*LORA, "learner.precision=bf16-mixed"],
        [],
    ],
    ids=["full", "bf16-mixed", "lora-bf16-mixed", "plain"],
)
def test_an_update_leaves_no_gradient_behind(overrides):
    learner = make_learner("grpo", "learner.minibatches=2", *overrides)
    metrics = learner.update_batch(batch_of())
    assert metrics["learner/optimizer_steps"] == 2 and metrics["learner/grad_norm"] > 0
    for module in (learner.policy, learner.compute_policy):
        held = [name for name, p in module.named_parameters() if p.grad is not None]
        assert not held, held[:3]


def test_an_update_with_a_critic_leaves_no_gradient_behind():
    learner = make_learner("ppo")
    learner.update_batch(batch_of())
    assert all(p.grad is None for p in [*learner.policy.parameters(), *learner.critic.parameters()])


def test_an_entropy_for_metrics_saves_nothing_for_the_backward():
    model = load_model("tiny-random")
    vocab = model.config.vocab_size
    input_ids = torch.randint(0, 1000, (2, 12), generator=torch.Generator().manual_seed(0))
    attention, mask = torch.ones_like(input_ids), torch.ones(2, 11)
    outputs, saved = {}, {}
    for case, flags in {
        "no entropy": {"entropy": False},
        "metric": {"entropy": True, "entropy_graph": False},
        "graph": {"entropy": True, "entropy_graph": True},
    }.items():
        with saved_shapes() as shapes:
            outputs[case] = masked_token_outputs(model, input_ids, attention, mask, **flags)
        saved[case] = shapes
    assert saved["metric"] == saved["no entropy"]
    assert len(vocabulary_wide(saved["graph"], vocab)) > len(vocabulary_wide(saved["metric"], vocab))
    assert not outputs["metric"]["entropy"].requires_grad and outputs["graph"]["entropy"].requires_grad
    assert torch.equal(outputs["metric"]["entropy"], outputs["graph"]["entropy"].detach())
    assert (outputs["metric"]["entropy"] > 0).all()


def test_the_update_keeps_the_entropy_graph_only_for_an_entropy_bonus():
    trajectories = batch_of()
    saved, metrics = {}, {}
    for coef in (0.0, 0.01):
        learner = make_learner("grpo", f"algorithm.entropy_coef={coef}")
        assert learner.algorithm.differentiates_entropy == (coef > 0)
        batch = learner.prepare(trajectories)
        with saved_shapes() as shapes:
            metrics[coef] = learner.accumulate_gradients(batch, torch.arange(len(trajectories)))
        saved[coef] = vocabulary_wide(shapes, learner.policy.config.vocab_size)
    assert len(saved[0.01]) > len(saved[0.0])
    # the metric is still reported, from the same forward, either way
    assert metrics[0.0]["learner/entropy"] == metrics[0.01]["learner/entropy"] > 0

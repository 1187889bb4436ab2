import torch

from agentgym_rl.actors.model_store import load_model
from agentgym_rl.learner.forward import mask_argument, masked_token_outputs


def right_padded_batch(seed: int, length: int, padding_from: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two random sequences of ``length`` ids; the second is padding from ``padding_from`` on."""
    input_ids = torch.randint(0, 1000, (2, length), generator=torch.Generator().manual_seed(seed))
    attention = torch.ones_like(input_ids)
    attention[1, padding_from:] = 0
    return input_ids, attention


def test_masked_scoring_equals_a_full_forward():
    model = load_model("tiny-random")
    input_ids, attention = right_padded_batch(0, 12, 9)
    mask = torch.zeros(2, 11)
    mask[0, 3:7] = 1
    mask[1, 2:5] = 1
    with torch.no_grad():
        full = torch.log_softmax(model(input_ids=input_ids, attention_mask=attention).logits.float(), -1)
        expected = full[:, :-1].gather(-1, input_ids[:, 1:, None]).squeeze(-1) * mask
        entropy = -(full.exp() * full).sum(-1)[:, :-1] * mask
        out = masked_token_outputs(model, input_ids, attention, mask, entropy=True)
    assert torch.allclose(out["logprobs"], expected, atol=1e-5)
    assert torch.allclose(out["entropy"], entropy, atol=1e-4)
    assert (out["logprobs"][mask == 0] == 0).all()


def test_only_a_right_padded_mask_is_left_to_causal_attention():
    right = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    left = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    holed = torch.tensor([[1, 0, 1, 1], [1, 1, 1, 1]])
    packed = torch.ones(2, 1, 4, 4, dtype=torch.bool)
    assert mask_argument(right) is None
    assert mask_argument(left) is left and mask_argument(holed) is holed and mask_argument(packed) is packed


def test_a_right_padded_sequence_scores_as_it_does_alone():
    model = load_model("tiny-random")
    input_ids, attention = right_padded_batch(1, 16, 10)
    mask = torch.zeros(2, 15)
    mask[1, 3:9] = 1  # the padded row's targets, all before its padding
    with torch.no_grad():
        batched = masked_token_outputs(model, input_ids, attention, mask, entropy=True)
        alone = masked_token_outputs(model, input_ids[1:, :10], attention[1:, :10], mask[1:, :9], entropy=True)
    assert torch.allclose(batched["logprobs"][1, :9], alone["logprobs"][0], atol=1e-5)
    assert torch.allclose(batched["entropy"][1, :9], alone["entropy"][0], atol=1e-4)

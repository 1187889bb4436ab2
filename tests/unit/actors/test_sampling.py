"""Sampling on the logits' device: the vectorised draw against torch.multinomial stream by stream, rows' streams
on the batch's device, and a decode step that copies no (rows x vocabulary) tensor to the host."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from agentgym_rl.actors.engines.decode import Row
from agentgym_rl.actors.engines.sampling import SamplingParams, filter_logits, sample_rows, stream_on
from tests.unit.actors.helpers import tiny_engine

aten = torch.ops.aten


def stream(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_sample_rows_draws_what_multinomial_draws_from_each_stream():
    logits = torch.randn(5, 300, generator=stream(0)) * 3  # (B, V)
    probs = torch.softmax(filter_logits(logits, top_k=7, top_p=0.9), dim=-1)  # zeros outside the kept sets
    for seed in range(20):
        shared, own = stream(seed), [stream(100 + seed), stream(200 + seed)]
        drawn = sample_rows(probs, [(shared, [0, 2, 3]), (own[0], [1]), (own[1], [4])])

        shared_ref, own_ref = stream(seed), [stream(100 + seed), stream(200 + seed)]
        expected = torch.empty(5, dtype=torch.long)
        expected[[0, 2, 3]] = torch.multinomial(probs[[0, 2, 3]], 1, generator=shared_ref).squeeze(-1)
        expected[1] = torch.multinomial(probs[1], 1, generator=own_ref[0])[0]
        expected[4] = torch.multinomial(probs[4], 1, generator=own_ref[1])[0]
        assert torch.equal(drawn, expected)
        # Each stream is left where multinomial leaves it: the next turn's draws continue alike.
        for after, reference in zip([shared, *own], [shared_ref, *own_ref], strict=True):
            assert torch.equal(after.get_state(), reference.get_state())


def test_one_stream_over_every_row_draws_what_one_multinomial_over_the_batch_draws():
    probs = torch.softmax(torch.randn(4, 50, generator=stream(1)), dim=-1)
    drawn = sample_rows(probs, [(stream(9), [0, 1, 2, 3])])
    assert torch.equal(drawn, torch.multinomial(probs, 1, generator=stream(9)).squeeze(-1))


def test_a_stream_already_on_the_device_kind_is_kept_as_it_is():
    generator = stream(3)
    assert stream_on(generator, torch.device("cpu")) is generator


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_host_stream_seeds_a_device_stream_from_one_draw():
    device = torch.device("cuda")
    first, again = stream_on(stream(5), device), stream_on(stream(5), device)
    assert first.device.type == "cuda"
    assert torch.equal(torch.rand(8, device=device, generator=first), torch.rand(8, device=device, generator=again))
    assert not torch.equal(stream_on(stream(6), device).get_state(), stream_on(stream(5), device).get_state())


class HostCopies(TorchDispatchMode):
    """Records the number of elements of every copy from an accelerator to the host while active."""

    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in (aten._to_copy.default, aten.copy_.default, aten._local_scalar_dense.default):
            source = args[1] if func is aten.copy_.default else args[0]
            if source.device.type != "cpu" and (not isinstance(out, torch.Tensor) or out.device.type == "cpu"):
                self.sizes.append(source.numel())
        return out


def test_a_decode_step_samples_on_the_batch_device_and_brings_back_only_per_row_values(tokenizer):
    """On a GPU only the sampled ids, their log-probs and the asked-for alternatives ((rows,) and (rows, k))
    come back to the host; on the CPU the host is the device and every row's stream is already there."""
    engine = tiny_engine(tokenizer)
    vocabulary = engine.model.config.vocab_size
    batch = engine.decode_batch(keep_finished=False)
    plain, alternatives = SamplingParams(max_new_tokens=4), SamplingParams(max_new_tokens=4, top_logprobs=2)
    rows = [Row(params=plain, generator=stream(1)), Row(params=alternatives, generator=stream(2)), Row(params=plain)]
    batch.add([[1, 2, 3], [4, 5], [6]], rows)
    assert all(row.generator.device.type == engine.device.type for row in rows[:2])
    copies = HostCopies()
    with copies:
        batch.step()
    assert all(len(row.tokens) == 1 for row in rows)
    assert max(copies.sizes, default=0) <= len(rows) * alternatives.top_logprobs < vocabulary

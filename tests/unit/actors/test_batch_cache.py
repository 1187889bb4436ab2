"""The decode batch's key/value cache kept in place: what the model reads equals the concatenated cache it
replaces, rows join and leave without copying the others, and decode attention over the slots equals attention
over the window."""

from __future__ import annotations

import torch

from agentgym_rl.actors.engines.attention import decode_attention
from agentgym_rl.actors.engines.batch_cache import BatchLayer, batch_cache
from agentgym_rl.actors.engines.decode import Row
from agentgym_rl.actors.engines.sampling import SamplingParams
from tests.unit.actors.helpers import tiny_engine

HEADS, DIM = 2, 4


def columns(rows: int, width: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(rows, HEADS, width, DIM, generator=generator)


def right_aligned(parts: list[torch.Tensor]) -> torch.Tensor:
    """Rows of ``parts`` stacked, each part right-aligned (zeros on the left) in the widest part's columns."""
    width = max(p.shape[2] for p in parts)
    return torch.cat([torch.nn.functional.pad(p, (0, 0, width - p.shape[2], 0)) for p in parts])


def test_joins_steps_and_leaves_read_as_the_concatenated_cache():
    g = torch.Generator().manual_seed(0)
    layer = BatchLayer(spare_rows=2)
    first = columns(2, 5, g)
    layer.update(first, first.clone())
    reference = first.clone()
    for _ in range(3):  # decode steps
        step = columns(2, 1, g)
        keys, values = layer.update(step, step.clone())
        reference = torch.cat([reference, step], dim=2)
    assert torch.equal(keys, reference) and torch.equal(values, reference)
    wider = columns(1, 12, g)  # wider than the window: every row's window grows to the left
    layer.append_rows(wider, wider.clone())
    reference = right_aligned([reference, wider])
    narrower = columns(1, 3, g)
    layer.append_rows(narrower, narrower.clone())
    reference = right_aligned([reference, narrower])
    assert torch.equal(layer.keys, reference)
    layer.keep_rows([1, 3], first=4)  # rows 0 and 2 leave; the first 4 columns no kept row attends
    reference = reference[[1, 3], :, 4:]
    assert torch.equal(layer.keys, reference) and torch.equal(layer.values, reference)
    for _ in range(200):  # past the spare columns: the window moves to new buffers
        step = columns(2, 1, g)
        layer.update(step, step.clone())
        reference = torch.cat([reference, step], dim=2)
    assert torch.equal(layer.keys, reference) and torch.equal(layer.values, reference)


def test_a_slot_reused_after_a_row_with_non_finite_values_holds_only_finite_values():
    g = torch.Generator().manual_seed(1)
    layer = BatchLayer(spare_rows=1)
    keys = columns(2, 6, g)
    keys[0] = float("nan")  # row 0's values overflowed
    layer.update(keys, keys.clone())
    layer.keep_rows([1], first=0)
    layer.append_rows(columns(1, 3, g), columns(1, 3, g))
    slot_keys, slot_values, _, _ = layer.slots()
    assert torch.isfinite(slot_keys).all() and torch.isfinite(slot_values).all()


def test_decode_attention_over_the_slots_equals_attention_over_the_window():
    g = torch.Generator().manual_seed(2)
    cache = batch_cache(1, spare_rows=1)
    layer = cache.layers[0]
    layer.update(columns(3, 7, g), columns(3, 7, g))
    layer.keep_rows([0, 2], first=2)
    layer.update(columns(2, 1, g), columns(2, 1, g))
    module = torch.nn.Module()
    module.layer_idx = 0
    query = torch.randn(2, 2 * HEADS, 1, DIM, generator=g)  # two query heads per key/value head
    mask = torch.ones(2, 1, 1, layer.width, dtype=torch.bool)
    mask[1, ..., :3] = False  # row 1's padding
    slots, _, start, end = layer.slots()
    assert slots.shape[2] > end - start  # the buffers have room beyond the window
    through_slots, _ = decode_attention(module, query, layer.keys, layer.values, mask, batch_cache=cache)
    over_window, _ = decode_attention(module, query, layer.keys.contiguous(), layer.values.contiguous(), mask)
    torch.testing.assert_close(through_slots, over_window)


def test_a_decode_batch_steps_and_takes_rows_in_without_moving_its_cache(tokenizer):
    engine = tiny_engine(tokenizer)
    batch = engine.decode_batch(keep_finished=False, max_rows=4)
    params = SamplingParams(max_new_tokens=40, temperature=1.0)
    batch.add([[5, 6, 7, 8]] * 2, [Row(params), Row(params)])
    layer = batch.cache.layers[0]
    buffer = layer.buffer_keys.data_ptr()
    for _ in range(10):
        batch.step()
    batch.add([[9, 10, 11]], [Row(params)])  # narrower than the batch: into a spare slot
    batch.step()
    assert layer.buffer_keys.data_ptr() == buffer
    assert layer.keys.shape[0] == len(batch.rows) and layer.keys.shape[2] == batch.width


def test_slots_kept_for_later_rows_stay_within_the_key_value_bound(tokenizer):
    engine = tiny_engine(tokenizer)
    batch = engine.decode_batch(keep_finished=False, max_rows=64, max_positions=200)
    batch.add([[5] * 10], [Row(SamplingParams(max_new_tokens=40))])  # a row can grow to 50 positions
    assert batch.cache.layers[0].buffer_keys.shape[0] == 200 // 50

"""The decode batch's key/value cache, kept in place as rows join, grow and leave.

transformers' ``DynamicLayer`` concatenates each step's new column onto the whole cache: a copy of every layer's
keys and values per decode step. A batch that rows join and leave (continuous batching) copied the whole cache
again at each join (padding and stacking) and each leave (gathering the rows that stay). A decode step on a CPU
is bound by memory traffic (the weights, then the cache it reads), and each such copy reads and writes the whole
cache: 184 MB for SmolLM2-135M's 8 rows of 1,000 positions in bfloat16.

A :class:`BatchLayer` holds each layer's keys and values in buffers with room to spare, slots by columns::

    slots     0 .. capacity      the first ``rows`` hold the batch's rows, in order
    columns   0 .. capacity      the batch's positions are the window start .. end

``keys``/``values`` (what transformers' bookkeeping reads) are views of the window. A forward writes its new
columns at ``end``; rows that join are written into the next free slots, right-aligned at ``end`` (the window
widens to the left when they are wider); rows that leave are closed up by moving the later slots down, and the
columns no row attends any more are left by moving ``start``. Only when the room runs out, or the columns left
behind outgrow the window, is the window copied into new buffers (with room again).

Decode attention reads the live slots' whole rows of columns (:meth:`BatchLayer.slots`), which are contiguous in
memory where the window is not (a batched matrix product over a strided window copies it first), and masks every
column outside the window. Masked columns get weight exactly 0, so what they hold must be finite: buffers start as
zeros, a joining row's slot is zeroed before it is written, and a slot moves down whole.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

# Columns of room a new buffer gets beyond what it holds: a quarter more, at least this many (one copy of the cache
# per that many decode steps, where concatenation copies it every step).
MIN_SPARE_COLUMNS = 64


class BatchLayer(DynamicLayer):
    """One layer's keys and values for a decode batch, in buffers with spare slots and columns.

    Args:
        spare_rows: slots beyond the rows it first holds (rows the batch may admit without a copy).
        max_spare_columns: at most this many columns of room beyond the window (what the rows can still grow
            by), so the buffers stay within the batch's key/value budget.
    """

    def __init__(self, *, spare_rows: int = 0, max_spare_columns: int | None = None) -> None:
        super().__init__()
        self.spare_rows = spare_rows
        self.max_spare_columns = max_spare_columns
        self.buffer_keys: torch.Tensor | None = None  # (R_cap, H_kv, C_cap, D)
        self.buffer_values: torch.Tensor | None = None
        self.rows = 0
        self.start = 0
        self.end = 0

    @property
    def width(self) -> int:
        """Columns of the window (the batch's key/value positions per row)."""
        return self.end - self.start

    def reserve(
        self, rows: int, width: int, room: int, *, shape: tuple[int, int], dtype: torch.dtype, device: torch.device
    ) -> None:
        """Start as ``rows`` rows of ``width`` zero columns (the caller writes them through ``keys``/``values``) with
        ``room`` more columns before the spare; ``shape``: (H_kv, D)."""
        self._allocate(rows, shape[0], width + room, shape[1], dtype, device)
        self.rows, self.start, self.end = rows, 0, width
        self._views()

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append a forward's new columns (B, H_kv, s, D) to every row; returns the window's keys and values."""
        batch, heads, new, dim = key_states.shape
        if self.buffer_keys is None:  # a prefill without cached positions
            self._allocate(batch, heads, new, dim, key_states.dtype, key_states.device)
            self.rows = batch
        if batch != self.rows:
            raise ValueError(f"{batch} rows of new keys for a cache layer of {self.rows} rows")
        if self.end + new > self.buffer_keys.shape[2]:
            self._regrow(self.rows, self.width + new)
        self.buffer_keys[: self.rows, :, self.end : self.end + new] = key_states
        self.buffer_values[: self.rows, :, self.end : self.end + new] = value_states
        self.end += new
        return self._views()

    def append_rows(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Add rows ``keys``/``values`` (b, H_kv, w, D), right-aligned at the window's end; a wider ``w`` widens
        the window to the left for every row (the old rows' new columns hold finite values the batch masks)."""
        added, _, columns, _ = keys.shape
        width = max(self.width, columns)
        if self.rows + added > self.buffer_keys.shape[0] or self.end - width < 0:
            self._regrow(self.rows + added, width, right_aligned=True)
        slots = slice(self.rows, self.rows + added)
        self.buffer_keys[slots] = 0  # a slot's earlier row may have failed with values that are not finite
        self.buffer_values[slots] = 0
        self.buffer_keys[slots, :, self.end - columns : self.end] = keys
        self.buffer_values[slots, :, self.end - columns : self.end] = values
        self.rows += added
        self.start = self.end - width
        self._views()

    def keep_rows(self, keep: list[int], first: int) -> None:
        """Keep rows ``keep`` (ascending), closed up in that order, and leave the window's first ``first`` columns."""
        for slot, row in enumerate(keep):
            if row != slot:  # slot < row: the slot's own row has moved down already or left
                self.buffer_keys[slot] = self.buffer_keys[row]
                self.buffer_values[slot] = self.buffer_values[row]
        self.rows = len(keep)
        self.start += first
        self._views()
        if self.start > self.width:  # decode attention reads the columns left behind too: copy the window down
            self._regrow(self.rows, self.width)

    def slots(self) -> tuple[torch.Tensor, torch.Tensor, int, int]:
        """The live slots' keys and values, every column (B, H_kv, C_cap, D), contiguous; and the window's
        start and end."""
        return self.buffer_keys[: self.rows], self.buffer_values[: self.rows], self.start, self.end

    def _spare_columns(self, width: int) -> int:
        spare = max(MIN_SPARE_COLUMNS, width // 4)
        return spare if self.max_spare_columns is None else min(spare, self.max_spare_columns)

    def _allocate(
        self, rows: int, heads: int, columns: int, dim: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        shape = (rows + self.spare_rows, heads, columns + self._spare_columns(columns), dim)
        self.buffer_keys = torch.zeros(shape, dtype=dtype, device=device)
        self.buffer_values = torch.zeros(shape, dtype=dtype, device=device)
        self.dtype, self.device, self.is_initialized = dtype, device, True

    def _regrow(self, rows: int, width: int, *, right_aligned: bool = False) -> None:
        """Copy the window into new buffers of ``rows`` slots and ``width`` columns (and room); the window's columns
        go to the left of the new buffers, or end at column ``width`` (``right_aligned``)."""
        old_keys, old_values = self.keys, self.values  # (B, H_kv, W, D)
        self._allocate(rows, old_keys.shape[1], width, old_keys.shape[3], old_keys.dtype, old_keys.device)
        offset = width - old_keys.shape[2] if right_aligned else 0
        self.buffer_keys[: self.rows, :, offset : offset + old_keys.shape[2]] = old_keys
        self.buffer_values[: self.rows, :, offset : offset + old_keys.shape[2]] = old_values
        self.start, self.end = offset, offset + old_keys.shape[2]
        self._views()

    def _views(self) -> tuple[torch.Tensor, torch.Tensor]:
        self.keys = self.buffer_keys[: self.rows, :, self.start : self.end]  # (B, H_kv, W, D)
        self.values = self.buffer_values[: self.rows, :, self.start : self.end]
        return self.keys, self.values


def batch_cache(layers: int, *, spare_rows: int = 0, max_spare_columns: int | None = None) -> DynamicCache:
    """A cache of ``layers`` empty :class:`BatchLayer` (reserved by the caller, or allocated by the first forward)."""
    cache = DynamicCache()
    cache.layers = [BatchLayer(spare_rows=spare_rows, max_spare_columns=max_spare_columns) for _ in range(layers)]
    return cache

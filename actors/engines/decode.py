"""The decode step shared by the engine's batch ``generate`` and continuous batching (samplers and serving).

A :class:`DecodeBatch` holds the rows (completions) decoded together: one key/value cache for all of
them, the attention mask over its columns, each row's next position id and the logits its next token
is drawn from. :meth:`DecodeBatch.step` samples one token for every running row, each with its own
settings and random stream, and runs one forward for the rows that go on. Two ways to drive it:

* ``TransformersEngine.generate`` adds all its rows at once (cached prefixes reused, see
  ``transformers_engine``) and steps until every row is done; finished rows stay in the batch as
  masked padding (``keep_finished``).
* ``ContinuousBatcher`` (samplers' turns and serving) adds rows between steps (their prompts prefilled,
  cached prefixes reused, then merged into the running batch) and drops a row the step it finishes
  (first copying out its keys/values when the caller keeps them) or its client goes away.

A row whose next-token probabilities are not finite (its logits overflowed: a prompt that drives a
half-precision activation past its range) fails alone: it samples nothing more, the step reports a
:class:`RowFailure` for it, and the other rows go on. Sampling settings cannot cause this (see
``SamplingParams``); rows never attend one another, so one row's values cannot spread to another.

Layout: every row is right-aligned, so its newest position is the last column; masked padding fills
the left. Merging two groups pads the narrower one on the left; dropping rows trims columns that no
row attends any more, so the cache is as wide as the longest live row::

    running:  . . p p p d d d        merged:  . . . . . p p p d d d
              p p p p p d d d                 . . . p p p p p d d d
    new:              q q q q                 . . . . . . . q q q q
"""

from __future__ import annotations

import logging
import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from agentgym_rl.actors.engines.batch_cache import batch_cache
from agentgym_rl.actors.engines.sampling import SamplingParams, StopStrings, filter_logits, sample_rows, stream_on

# transformers 5.2x renamed the forward's `past_key_values` to `cache` and says so in every process that decodes
# (a FutureWarning and a log line); the versions supported from 4.56 on know only the old name, which all still take.
warnings.filterwarnings("ignore", message="`past_key_values` is deprecated", category=FutureWarning)
logging.getLogger("transformers.utils.generic").setLevel(logging.ERROR)

# Per row: (cached length, its per-layer keys/values or None). Cached columns come before new ids.
Reused = tuple[int, list[tuple[torch.Tensor, torch.Tensor]] | None]


@dataclass(eq=False)
class Row:
    """One completion being decoded; ``tokens``/``logprobs`` grow by one per step until ``finish_reason``.

    Attributes:
        params: how this row is sampled.
        generator: the row's own random stream; None draws from the batch's shared stream. A stream on
            another device than the batch's is replaced by one on the batch's device, seeded from it.
        stops: matcher of ``params.stop`` (None when there are none).
        tag: the caller's handle on the row (the batch never reads it).
        keep_cache: when the row finishes in a batch that drops finished rows, copy its keys/values out first
            into ``kept`` (the caller stores them for the episode's next turn).
        kept: per layer (keys, values), each ``(H_kv, len(prompt) + len(tokens) - 1, D)``: the row's real
            positions, its last token excluded (it was never fed).
        counts: (V,) occurrences of each token in the reply, kept only for penalised rows.
        failure: why the row stopped without finishing (see :class:`RowFailure`); it samples no more.
    """

    params: SamplingParams
    generator: torch.Generator | None = None
    stops: StopStrings | None = None
    tag: Any = None
    keep_cache: bool = False
    kept: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[tuple[tuple[int, float], ...]] = field(default_factory=list)
    finish_reason: Literal["stop", "length"] | None = None
    counts: torch.Tensor | None = None
    failure: RowFailedError | None = None

    @property
    def done(self) -> bool:
        """Whether the row samples no more (finished or failed)."""
        return self.finish_reason is not None or self.failure is not None


class RowFailedError(RuntimeError):
    """One row's next-token probabilities were not finite; that row alone is failed."""


@dataclass(frozen=True)
class RowFailure:
    """A row the step failed instead of sampling for it (``row.failure`` holds ``error``)."""

    row: Row
    error: RowFailedError


@dataclass(frozen=True)
class StepToken:
    """What one step sampled for one row: the token, its log-probability, the row's top alternatives
    (when it asked for them) and ``finish_reason`` once this token ended the row."""

    row: Row
    token_id: int
    logprob: float
    top_logprobs: tuple[tuple[int, float], ...]
    finish_reason: Literal["stop", "length"] | None


def prefill_inputs(
    prompts: list[list[int]], reused: list[Reused], pad_token_id: int, device: torch.device, cache: DynamicCache
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Input ids (B, S), attention mask (B, C + S) and position ids (B, S) of a prefill where row ``i`` reuses
    ``reused[i][0]`` cached positions, whose keys/values go into ``cache`` (empty :class:`BatchLayer` layers,
    reserved here with room for the S new columns)::

        columns:  [ cached prefix, right-aligned in C | new suffix, right-aligned in S ]
        row 0:      . . k k k k k                        . . s s s        (reused 5, new 3)
        row 1:      . . . . . . .                        s s s s s        (no cache: a fresh prompt)
        row 2:      k k k k k k k                        . . . . s        (reused 7, new 1)

    Padding columns are masked out; position ids are each row's true positions, so the logits equal
    those of a full prefill of the whole prompt (up to float rounding).
    """
    batch = len(prompts)
    width_cached = max(length for length, _ in reused)  # C
    suffixes = [prompt[length:] for prompt, (length, _) in zip(prompts, reused, strict=True)]
    width_new = max(len(s) for s in suffixes)  # S
    input_ids = torch.full((batch, width_new), pad_token_id, dtype=torch.long)
    attention = torch.zeros((batch, width_cached + width_new), dtype=torch.long)
    positions = torch.zeros((batch, width_new), dtype=torch.long)
    for row, (suffix, (length, _)) in enumerate(zip(suffixes, reused, strict=True)):
        # Right-aligned new ids keep every row's last prompt token in the last column.
        input_ids[row, width_new - len(suffix) :] = torch.tensor(suffix, dtype=torch.long)
        attention[row, width_cached - length : width_cached] = 1
        attention[row, width_cached + width_new - len(suffix) :] = 1
        positions[row, width_new - len(suffix) :] = torch.arange(length, length + len(suffix))
    if width_cached > 0:
        sample = next(layers for _, layers in reused if layers is not None)
        for index, (layer, (sample_keys, _)) in enumerate(zip(cache.layers, sample, strict=True)):
            heads, _, head_dim = sample_keys.shape
            layer.reserve(
                batch, width_cached, width_new, shape=(heads, head_dim), dtype=sample_keys.dtype, device=device
            )
            for row, (length, layers) in enumerate(reused):
                if layers is not None:
                    layer.keys[row, :, width_cached - length :] = layers[index][0]
                    layer.values[row, :, width_cached - length :] = layers[index][1]
    return input_ids.to(device), attention.to(device), positions.to(device)


class DecodeBatch:
    """Rows decoded together with one model forward per step.

    Args:
        model: the causal LM (shared with the engine that owns it).
        stop_token_ids: ids that end a row (1-D tensor on the model's device).
        pad_token_id: id fed for masked rows (never recorded).
        generator: the shared random stream of rows without their own.
        keep_finished: keep finished rows as masked padding until the batch ends (``generate``'s
            behaviour) instead of dropping them the step they finish (serving).
        max_rows: rows the batch may hold at once (its cache keeps slots for them, as far as ``max_positions``
            allows); None: as many as it starts with, more by a copy of the cache.
        max_positions: bound on the key/value positions of the slots kept for later rows (rows x columns).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        stop_token_ids: torch.Tensor,
        pad_token_id: int,
        generator: torch.Generator,
        keep_finished: bool,
        max_rows: int | None = None,
        max_positions: int | None = None,
    ) -> None:
        self.model = model
        self.max_rows = max_rows
        self.max_positions = max_positions
        self.layers = model.config.get_text_config(decoder=True).num_hidden_layers
        self.device = stop_token_ids.device
        self.stop_token_ids = stop_token_ids
        self.stop_id_set = frozenset(stop_token_ids.tolist())
        self.pad_token_id = pad_token_id
        self.generator = generator
        self.keep_finished = keep_finished
        self.rows: list[Row] = []
        self.cache: DynamicCache | None = None
        self.attention: torch.Tensor | None = None  # (B, W)
        self.positions: torch.Tensor | None = None  # (B, 1): position id of each row's newest column
        self.next_logits: torch.Tensor | None = None  # (B, V), float32

    @property
    def running(self) -> bool:
        """Whether some row still samples."""
        return any(not row.done for row in self.rows)

    @property
    def width(self) -> int:
        """Key/value columns per row (the cache holds ``len(rows) * width`` positions per layer)."""
        return 0 if self.attention is None else self.attention.shape[1]

    @torch.inference_mode()
    def add(self, prompts: list[list[int]], rows: list[Row], reused: list[Reused] | None = None) -> int:
        """Prefill ``prompts`` (one per new row; ``reused``: cached prefixes, see :func:`prefill_inputs`)
        and merge the new rows into the batch; returns the number of prompt ids run through the model."""
        reused = reused if reused is not None else [(0, None)] * len(prompts)
        # Rows that start the batch get its room (slots for later rows, columns to grow by); rows joining a running
        # batch are copied into its cache, so theirs is exact.
        starting = not self.rows
        cache = batch_cache(
            self.layers,
            spare_rows=self._spare_rows(prompts, rows) if starting else 0,
            max_spare_columns=self._growth(rows) if starting else 0,
        )
        input_ids, attention, positions = prefill_inputs(prompts, reused, self.pad_token_id, self.device, cache)
        for row in rows:
            if row.generator is not None:
                row.generator = stream_on(row.generator, self.device)
            if row.params.penalised and row.counts is None:
                row.counts = torch.zeros(self.model.config.vocab_size, device=self.device)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            batch_cache=cache,  # decode attention reads the cache's slots (see ``attention``)
            logits_to_keep=1,  # only the last position's logits: the full (B, T, V) tensor would dwarf the cache
        )
        self._merge(out.past_key_values, attention, positions[:, -1:], out.logits[:, -1, :].float(), rows)
        return sum(len(p) - length for p, (length, _) in zip(prompts, reused, strict=True))

    @torch.inference_mode()
    def step(self) -> list[StepToken | RowFailure]:
        """Sample one token for every running row, then feed the rows that go on through the model; a row
        whose probabilities are not finite gets a :class:`RowFailure` instead of a token.

        The last token of a row is never fed back: its cache ends just before it.
        """
        rows = self.rows
        running = [i for i, row in enumerate(rows) if not row.done]
        scaled, probs = self._distributions()
        step_logprobs = torch.log_softmax(scaled, dim=-1)  # (B, V)
        sampled = self._sample(probs, running)  # (B,)
        sampled_lp = step_logprobs.gather(-1, sampled[:, None]).squeeze(-1)  # (B,)
        # A row without a finite distribution reads as NaN here, in the same copy to the host as the
        # log-probabilities (no extra sync per step).
        finite = torch.isfinite(probs).all(dim=-1) & torch.isfinite(sampled_lp)  # (B,)
        sampled_lp = sampled_lp.masked_fill(~finite, float("nan"))
        tops = self._top_logprobs(step_logprobs, running)
        ids, lps = sampled.tolist(), sampled_lp.tolist()
        events: list[StepToken | RowFailure] = []
        for i in running:
            row, token = rows[i], ids[i]
            if math.isnan(lps[i]):
                row.failure = RowFailedError(
                    f"the model's next-token probabilities for this completion are not finite after "
                    f"{len(row.tokens)} tokens: the logits overflowed (float16 weights) or the weights hold NaN"
                )
                events.append(RowFailure(row, row.failure))
                continue
            row.tokens.append(token)
            row.logprobs.append(lps[i])
            top = tops.get(i, ())
            if row.params.top_logprobs:
                row.top_logprobs.append(top)
            if row.counts is not None:
                row.counts[token] += 1
            if token in self.stop_id_set or (row.stops is not None and row.stops.completed(row.tokens)):
                row.finish_reason = "stop"
            elif len(row.tokens) >= row.params.max_new_tokens:
                row.finish_reason = "length"
            events.append(StepToken(row, token, lps[i], top, row.finish_reason))
        going = [i for i, row in enumerate(rows) if not row.done]
        if not self.keep_finished and len(going) < len(rows):
            for i in running:
                if rows[i].keep_cache and rows[i].finish_reason is not None:
                    rows[i].kept = self.row_cache(i)
            self._select(going)
            sampled = sampled[torch.tensor(going, device=self.device, dtype=torch.long)]
        if not going:
            return events
        finished = torch.tensor([row.done for row in self.rows], device=self.device)
        feed = sampled.masked_fill(finished, self.pad_token_id)
        self.attention = torch.cat([self.attention, (~finished).long()[:, None]], dim=-1)
        self.positions = self.positions + 1
        out = self.model(
            input_ids=feed[:, None],
            attention_mask=self.attention,
            position_ids=self.positions,
            past_key_values=self.cache,
            use_cache=True,
            batch_cache=self.cache,
        )
        self.next_logits = out.logits[:, -1, :].float()
        return events

    def row_cache(self, index: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Row ``index``'s own keys/values, copied out: per layer (keys, values), each ``(H_kv, n, D)`` over the
        row's real positions in order (its padding left out)."""
        columns = self.attention[index].nonzero().flatten()
        return [(layer.keys[index][:, columns], layer.values[index][:, columns]) for layer in self.cache.layers]

    @torch.inference_mode()
    def drop(self, rows: list[Row]) -> None:
        """Remove ``rows`` from the batch at once (finished elsewhere, or their client went away)."""
        gone = {id(row) for row in rows}
        self._select([i for i, row in enumerate(self.rows) if id(row) not in gone])

    def _distributions(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Temperature-scaled logits (B, V) and the probabilities (B, V) after top-k/top-p, per row."""
        logits = self.next_logits
        penalised = [i for i, row in enumerate(self.rows) if row.counts is not None]
        if penalised:
            logits = logits.clone()
            for i in penalised:
                params, counts = self.rows[i].params, self.rows[i].counts
                logits[i] -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0)
        groups: dict[tuple[float, int, float], list[int]] = {}
        for i, row in enumerate(self.rows):
            groups.setdefault(row.params.distribution, []).append(i)
        if len(groups) == 1:
            # One setting for the whole batch (every sampler batch): whole-tensor ops.
            temperature, top_k, top_p = next(iter(groups))
            scaled = logits / temperature
            return scaled, torch.softmax(filter_logits(scaled, top_k, top_p), dim=-1)
        # Softmax, top-k and sorting work row by row, so each group's rows come out as they would alone.
        scaled, probs = torch.empty_like(logits), torch.empty_like(logits)
        for (temperature, top_k, top_p), members in groups.items():
            index = torch.tensor(members, device=self.device)
            part = logits[index] / temperature
            scaled[index] = part
            probs[index] = torch.softmax(filter_logits(part, top_k, top_p), dim=-1)
        return scaled, probs

    def _sample(self, probs: torch.Tensor, running: list[int]) -> torch.Tensor:
        """One token id per row, drawn on the batch's device (ids of rows that do not sample are ignored).
        probs: (B, V); returns (B,)."""
        rows = self.rows
        if all(row.generator is None for row in rows):
            return sample_rows(probs, [(self.generator, list(range(len(rows))))])
        # One stream per row, drawn only while the row runs: a row's samples do not depend on
        # which other rows share the batch or how long they run.
        shared = [i for i in running if rows[i].generator is None]
        own = [(rows[i].generator, [i]) for i in running if rows[i].generator is not None]
        return sample_rows(probs, [(self.generator, shared), *own])

    def _top_logprobs(
        self, step_logprobs: torch.Tensor, running: list[int]
    ) -> dict[int, tuple[tuple[int, float], ...]]:
        """Per running row that asks for them, its ``top_logprobs`` likeliest (token, log-prob) pairs."""
        wanted = [i for i in running if self.rows[i].params.top_logprobs]
        if not wanted:
            return {}
        k = max(self.rows[i].params.top_logprobs for i in wanted)
        values, indices = torch.topk(step_logprobs[torch.tensor(wanted, device=self.device)], k, dim=-1)  # (R, k)
        values, indices = values.tolist(), indices.tolist()
        return {
            i: tuple(zip(indices[n], values[n], strict=True))[: self.rows[i].params.top_logprobs]
            for n, i in enumerate(wanted)
        }

    def _merge(
        self,
        cache: DynamicCache,
        attention: torch.Tensor,
        positions: torch.Tensor,
        logits: torch.Tensor,
        rows: list[Row],
    ) -> None:
        """Append freshly prefilled rows; the narrower side is padded on the left (masked)."""
        if not self.rows:
            self.rows, self.cache, self.attention, self.positions, self.next_logits = (
                list(rows),
                cache,
                attention,
                positions,
                logits,
            )
            return
        width = max(self.width, attention.shape[1])
        old_pad, new_pad = width - self.width, width - attention.shape[1]
        growth = self._growth([*self.rows, *rows])
        for old, new in zip(self.cache.layers, cache.layers, strict=True):
            old.max_spare_columns = growth
            old.append_rows(new.keys, new.values)
        self.attention = torch.cat([F.pad(self.attention, (old_pad, 0)), F.pad(attention, (new_pad, 0))])
        self.positions = torch.cat([self.positions, positions])
        self.next_logits = torch.cat([self.next_logits, logits])
        self.rows = self.rows + list(rows)

    def _select(self, keep: list[int]) -> None:
        """Keep only rows ``keep`` (in order) and trim the columns none of them attends."""
        if not keep:
            self.rows, self.cache, self.attention, self.positions, self.next_logits = [], None, None, None, None
            return
        if len(keep) == len(self.rows):
            return
        index = torch.tensor(keep, device=self.device)
        self.rows = [self.rows[i] for i in keep]
        self.attention = self.attention[index]
        self.positions = self.positions[index]
        self.next_logits = self.next_logits[index]
        # Rows are right-aligned, so the columns no kept row attends are a prefix.
        first = int(self.attention.any(dim=0).long().argmax())
        self.attention = self.attention[:, first:]
        for layer in self.cache.layers:
            layer.keep_rows(keep, first)

    def _spare_rows(self, prompts: list[list[int]], rows: list[Row]) -> int:
        """Slots to keep for rows that join later: up to ``max_rows``, within ``max_positions`` at the width these
        rows can grow to."""
        slots = self.max_rows or len(prompts)
        if self.max_positions is not None:
            slots = min(slots, self.max_positions // (max(map(len, prompts)) + self._growth(rows)))
        return max(0, slots - len(prompts))

    @staticmethod
    def _growth(rows: list[Row]) -> int:
        """Columns the rows can still add: the most tokens any of them may still sample."""
        return max((row.params.max_new_tokens - len(row.tokens) for row in rows), default=0)

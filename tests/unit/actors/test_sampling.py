"""The decode step's token draw: the right distribution, never a filtered token, one stream per seed."""

from __future__ import annotations

import torch

from agentgym_rl.actors.engines.sampling import filter_logits, sample_tokens


def test_draws_follow_each_rows_distribution_and_skip_zero_probability_tokens():
    probs = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.0, 0.0, 0.1, 0.9]]).repeat(20_000, 1)  # (40000, 4)
    ids = sample_tokens(probs, torch.Generator().manual_seed(0))
    first, second = ids[0::2], ids[1::2]
    counts = [torch.bincount(rows, minlength=4).double() / rows.numel() for rows in (first, second)]
    # 20,000 draws: a frequency's standard error is at most 0.0035, so 0.015 is more than 4 of them.
    assert torch.allclose(counts[0], torch.tensor([0.5, 0.3, 0.2, 0.0], dtype=torch.float64), atol=0.015)
    assert torch.allclose(counts[1], torch.tensor([0.0, 0.0, 0.1, 0.9], dtype=torch.float64), atol=0.015)
    assert counts[0][3] == 0 and counts[1][:2].sum() == 0


def test_top_k_over_a_large_vocabulary_only_ever_draws_the_kept_tokens():
    logits = torch.randn(64, 49_152, generator=torch.Generator().manual_seed(1))
    kept = filter_logits(logits, top_k=5, top_p=1.0)
    probs = torch.softmax(kept, dim=-1)
    for seed in range(20):
        ids = sample_tokens(probs, torch.Generator().manual_seed(seed))
        assert torch.isfinite(kept.gather(-1, ids[:, None])).all()


def test_the_same_seed_draws_the_same_tokens_and_another_seed_others():
    probs = torch.softmax(torch.randn(32, 1000, generator=torch.Generator().manual_seed(2)), dim=-1)
    first = sample_tokens(probs, torch.Generator().manual_seed(7))
    again = sample_tokens(probs, torch.Generator().manual_seed(7))
    other = sample_tokens(probs, torch.Generator().manual_seed(8))
    assert torch.equal(first, again)
    assert not torch.equal(first, other)
    assert first.shape == (32,) and first.dtype == torch.long

"""Synthetic training data: seeded token sequences, so that no data set is needed.

Each sequence counts up from a random start by a random stride of 1-4 (mod V), so there is
something to learn (the loss falls from ln V towards ln 4 and below) and parity tests compare
real training, not noise.

Every rank generates the same global batch for a step (from the seed and the step number) and
takes its own slice: micro-batch m of DP rank d is rows [(m·dp + d)·B, (m·dp + d + 1)·B) of the
global batch. The global batch of a step therefore does not depend on how it is split, which is
what makes stage 0 on N ranks comparable with one process on the whole batch.
"""

from __future__ import annotations

import torch


def global_batch(*, seed: int, step: int, sequences: int, seq_len: int, vocab: int) -> torch.Tensor:
    """(sequences, seq_len + 1) int64 tokens of step `step`; inputs are [:, :-1], targets [:, 1:]."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    start = torch.randint(0, vocab, (sequences, 1), generator=gen)
    stride = torch.randint(1, 5, (sequences, 1), generator=gen)
    return (start + stride * torch.arange(seq_len + 1)) % vocab


def micro_batch(tokens: torch.Tensor, *, micro: int, dp_rank: int, dp: int, size: int
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets), each (size, seq_len), of micro-batch `micro` of DP rank `dp_rank`."""
    start = (micro * dp + dp_rank) * size
    rows = tokens[start:start + size]
    assert rows.shape[0] == size, "global batch smaller than dp x grad_accum x micro_batch"
    return rows[:, :-1], rows[:, 1:]

"""Stage 0: plain data parallelism (the ZeRO paper's baseline, §3 and §7.1).

Every rank holds all model states: parameters (es·Ψ), gradients (es·Ψ) and optimizer state (KΨ).
Gradients accumulate into one contiguous buffer (each unit's `.grad` is a view of it); on the last
micro-batch of a step each bucket is all-reduced in place as soon as its units are done, while
backward continues. Communication per step: an all-reduce of Ψ elements = 2Ψ (§7.1).
"""

from __future__ import annotations

import torch

from .buckets import AllReduceBuckets, plan_buckets
from .engine import Unit, ZeroEngine
from .optimizer import FlatAdam, Segment


class Stage0(ZeroEngine):
    stage = 0
    partitioned = frozenset()

    def setup(self, init32: list[torch.Tensor]) -> FlatAdam:
        for u, values in zip(self.units, init32):
            u.param = values.to(self.dtype).requires_grad_(True)
            self.ledger.add("params", u.param.nbytes)
        self.offsets, self.grad_buffer = _contiguous_grads(self.units, self.dtype, self.device)
        self.ledger.add("grads", self.grad_buffer.nbytes)
        elements = [u.layout.padded for u in self.units]
        # each model chunk's buckets apart, numbered from 0 per chunk (Megatron-LM: one DDP per chunk,
        # its own buckets; the plan's StepPass per chunk), the later chunks' first as backward makes them
        buckets, names = [], []
        for ids in reversed(self.options.chunks or (tuple(range(len(self.units))),)):
            for k, local in enumerate(plan_buckets([elements[i] for i in ids], self.options.bucket_elements)):
                buckets.append([ids[j] for j in local])
                names.append(f"grads.bucket.{k}")
        self.reducer = AllReduceBuckets(buckets, self.offsets, elements, self.grad_buffer, self.comm, names)
        return self._optimizer([Segment(u.param.detach(), u.param.grad, i) for u, i in zip(self.units, init32)])

    def zero_grads(self) -> None:
        self.grad_buffer.zero_()

    def grad_ready(self, unit: Unit) -> None:
        if self.reduce_now:
            self.reducer.grad_ready(unit.index)

    def finish_reduction(self) -> None:
        self.reducer.finish()


def _contiguous_grads(units: list[Unit], dtype: torch.dtype, device: torch.device
                      ) -> tuple[list[int], torch.Tensor]:
    """One gradient buffer for all units, each unit's `.grad` a view of it (autograd accumulates
    into an existing `.grad` in place). Returns (unit offsets, buffer)."""
    offsets, total = [], 0
    for u in units:
        offsets.append(total)
        total += u.layout.padded
    buffer = torch.zeros(total, dtype=dtype, device=device)
    for u, offset in zip(units, offsets):
        u.param.grad = buffer[offset:offset + u.layout.padded]
    return offsets, buffer

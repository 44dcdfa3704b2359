"""Stage 2, Pos+g (ZeRO paper §5.2): optimizer states and gradients partitioned.

Each rank keeps all fp16/bf16 parameters (es·Ψ, laid out bucket by bucket as in stage 1) but only
its gradient chunks (es·Ψ/Nd) and optimizer chunks (KΨ/Nd): memory (2 + 14/Nd)Ψ mixed (Table 1).
During backward, as soon as a unit's gradient is complete it is copied into its bucket and freed;
a full bucket is reduce-scattered while backward continues, and each rank adds the summed chunk it
owns to its gradient partition (so gradient accumulation over micro-batches reduces every
micro-batch). After the step the updated parameters are all-gathered as in stage 1.
Communication per step (one micro-batch): reduce-scatter Ψ + all-gather Ψ = 2Ψ (§7.2.1).
"""

from __future__ import annotations

import torch

from .buckets import PartitionReducer
from .engine import Unit, ZeroEngine
from .optimizer import FlatAdam
from .stage1 import all_gather_updated_params, flat_params, owned_segments


class Stage2(ZeroEngine):
    stage = 2
    partitioned = frozenset({"optimizer", "grads"})

    def setup(self, init32: list[torch.Tensor]) -> FlatAdam:
        self.flat32 = flat_params(self, init32)
        part = self.part
        self.grad_partition = torch.zeros(part.shard, dtype=self.dtype, device=self.device)
        self.ledger.add("grads", self.grad_partition.nbytes)
        self.grad_chunks, at = [], 0
        for b in range(len(part.buckets)):
            self.grad_chunks.append(self.grad_partition[at:at + part.chunk(b)])
            at += part.chunk(b)
        self.reducer = PartitionReducer(part, self.comm, self.ledger, self._deliver, self.dtype, self.device)
        return self._optimizer(owned_segments(self, lambda b: self.grad_chunks[b]))

    def _deliver(self, bucket: int, out: torch.Tensor) -> None:
        self.grad_chunks[bucket].add_(out)

    def zero_grads(self) -> None:
        self.grad_partition.zero_()

    def grad_ready(self, unit: Unit) -> None:
        grad = unit.param.grad
        self.ledger.add("grads", grad.nbytes)  # the unit's whole gradient, until it is in its bucket
        self.reducer.grad_ready(unit.index, grad)
        unit.param.grad = None
        self.ledger.add("grads", -grad.nbytes)

    def finish_reduction(self) -> None:
        self.reducer.finish()

    def after_step(self) -> None:
        all_gather_updated_params(self)

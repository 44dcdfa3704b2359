"""Stage 2, Pos+g (ZeRO paper §5.2): optimizer states and gradients partitioned.

Each rank keeps all fp16/bf16 parameters (es·Ψ) but only its gradient shards (es·Ψ/Nd) and
optimizer shards (KΨ/Nd): memory (2 + 14/Nd)Ψ mixed (Table 1). During backward, as soon as a
unit's gradient is complete it is copied into its bucket and freed; a full bucket is
reduce-scattered while backward continues, and each rank adds the summed shards it owns to its
gradient partition (so gradient accumulation over micro-batches reduces every micro-batch).
After the step the updated parameters are all-gathered as in stage 1.
Communication per step (one micro-batch): reduce-scatter Ψ + all-gather Ψ = 2Ψ (§7.2.1).
"""

from __future__ import annotations

import torch

from .buckets import ReduceScatterBuckets, plan_buckets
from .engine import Unit, ZeroEngine
from .optimizer import FlatAdam
from .stage1 import all_gather_updated_params


class Stage2(ZeroEngine):
    stage = 2
    partitioned = frozenset({"optimizer", "grads"})

    def setup(self, init32: list[torch.Tensor]) -> FlatAdam:
        for u, values in zip(self.units, init32):
            u.param = values.to(self.dtype).requires_grad_(True)
            self.ledger.add("params", u.param.nbytes)
        params = [self.shard_of(u.param.detach(), u) for u in self.units]
        return self._partitioned_grads_and_optimizer(init32, params)

    def _partitioned_grads_and_optimizer(self, init32: list[torch.Tensor], params: list[torch.Tensor]
                                         ) -> FlatAdam:
        """The gradient partition (this rank's shards of every unit, concatenated in unit order),
        the reduce-scatter buckets that fill it, and the optimizer over the owned shards."""
        self.partition_offsets, total = [], 0
        for u in self.units:
            self.partition_offsets.append(total)
            total += u.layout.shard
        self.grad_partition = torch.zeros(total, dtype=self.dtype, device=self.device)
        self.ledger.add("grads", self.grad_partition.nbytes)
        self.reducer = ReduceScatterBuckets(
            plan_buckets([u.layout.padded for u in self.units], self.options.bucket_elements),
            [u.layout.shard for u in self.units], self.comm, self.ledger, self._deliver, self.dtype, self.device)
        grads = [self.grad_partition[o:o + u.layout.shard] for u, o in zip(self.units, self.partition_offsets)]
        return self._optimizer(self._owned_segments(init32, params, grads))

    def _deliver(self, bucket: int, out: torch.Tensor) -> None:
        """A bucket's units are consecutive, so their shards are one slice of the partition."""
        start = self.partition_offsets[self.reducer.buckets[bucket][0]]
        self.grad_partition[start:start + out.numel()].add_(out)

    def zero_grads(self) -> None:
        self.grad_partition.zero_()

    def grad_ready(self, unit: Unit) -> None:
        grad = unit.param.grad
        self.ledger.add("buffers", grad.nbytes)  # the unit's whole gradient, until it is in its bucket
        self.reducer.grad_ready(unit.index, grad)
        unit.param.grad = None
        self.ledger.add("buffers", -grad.nbytes)

    def finish_reduction(self) -> None:
        self.reducer.finish()

    def after_step(self) -> None:
        all_gather_updated_params(self)

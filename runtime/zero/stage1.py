"""Stage 1, Pos (ZeRO paper §5.1): optimizer states partitioned across the Nd DP ranks.

Each rank still holds all fp16/bf16 parameters (es·Ψ) and gradients (es·Ψ), but only 1/Nd of
the optimizer state (KΨ/Nd): memory (2 + 2 + K/Nd)Ψ mixed (Table 1). After backward, gradient
buckets are reduce-scattered (each rank needs only the summed gradient of the shards it updates),
each rank updates its shards, and the updated parameters are all-gathered, unit by unit.
Communication per step: reduce-scatter Ψ + all-gather Ψ = 2Ψ, the same as plain DP (§7.2.1).
"""

from __future__ import annotations

import torch

from .buckets import ReduceScatterBuckets, plan_buckets
from .engine import Unit, ZeroEngine, unit_what
from .optimizer import FlatAdam
from .stage0 import _contiguous_grads


class Stage1(ZeroEngine):
    stage = 1
    partitioned = frozenset({"optimizer"})

    def setup(self, init32: list[torch.Tensor]) -> FlatAdam:
        for u, values in zip(self.units, init32):
            u.param = values.to(self.dtype).requires_grad_(True)
            self.ledger.add("params", u.param.nbytes)
        _, self.grad_buffer = _contiguous_grads(self.units, self.dtype, self.device)
        self.ledger.add("grads", self.grad_buffer.nbytes)
        self.reducer = ReduceScatterBuckets(
            plan_buckets([u.layout.padded for u in self.units], self.options.bucket_elements),
            [u.layout.shard for u in self.units], self.comm, self.ledger, self._deliver, self.dtype, self.device)
        return self._optimizer(self._owned_segments(init32, [self.shard_of(u.param.detach(), u) for u in self.units],
                                                    [self.shard_of(u.param.grad, u) for u in self.units]))

    def _deliver(self, bucket: int, out: torch.Tensor) -> None:
        """The summed shards of a bucket's units overwrite this rank's shards of the full gradients."""
        col = 0
        for i in self.reducer.buckets[bucket]:
            u = self.units[i]
            self.shard_of(u.param.grad, u).copy_(out[col:col + u.layout.shard])
            col += u.layout.shard

    def zero_grads(self) -> None:
        self.grad_buffer.zero_()

    def grad_ready(self, unit: Unit) -> None:
        if self.reduce_now:
            self.reducer.grad_ready(unit.index, unit.param.grad)

    def finish_reduction(self) -> None:
        self.reducer.finish()

    def after_step(self) -> None:
        all_gather_updated_params(self)


def all_gather_updated_params(engine: ZeroEngine) -> None:
    """Stages 1-2: every rank updated its shard of each unit; gather the whole units, in place
    (this rank's input is its own shard of the output), all issued before any is waited on."""
    pending = []
    for u in engine.units:
        full = u.param.detach()
        pending.append(engine.comm.all_gather(full, engine.shard_of(full, u), f"params.{unit_what(u)}"))
    for p in pending:
        p.wait()

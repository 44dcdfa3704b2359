"""Stage 1, Pos (ZeRO paper §5.1): optimizer states partitioned across the Nd DP ranks.

Each rank still holds all fp16/bf16 parameters (es·Ψ) and gradients (es·Ψ), but only 1/Nd of
the optimizer state (KΨ/Nd): memory (2 + 2 + K/Nd)Ψ mixed (Table 1). Parameters and gradients live
in one flat buffer each, laid out bucket by bucket (runtime/zero/partition.py: each bucket padded
to a multiple of 2·Nd, rank r owning its r-th chunk). After backward, each gradient bucket is
reduce-scattered (each rank needs only the summed gradient of the chunks it updates), each rank
updates its chunks, and the updated parameters are all-gathered, bucket by bucket.
Communication per step: reduce-scatter Ψ + all-gather Ψ = 2Ψ, the same as plain DP (§7.2.1).
"""

from __future__ import annotations

import torch

from .buckets import PartitionReducer
from .engine import Unit, ZeroEngine
from .optimizer import FlatAdam, Segment
from .partition import BucketPartition


class Stage1(ZeroEngine):
    stage = 1
    partitioned = frozenset({"optimizer"})

    def setup(self, init32: list[torch.Tensor]) -> FlatAdam:
        self.flat32 = flat_params(self, init32)
        self.grad_flat = torch.zeros(self.part.total, dtype=self.dtype, device=self.device)
        self.ledger.add("grads", self.grad_flat.nbytes)
        for u in self.units:
            at = self.part.unit_offset[u.index]
            u.param.grad = self.grad_flat[at:at + u.layout.numel]  # autograd accumulates in place
        self.reducer = PartitionReducer(self.part, self.comm, self.ledger, self._deliver, self.dtype, self.device,
                                        source=self.grad_flat)
        return self._optimizer(owned_segments(self, lambda b: self.part.own(self.grad_flat, b, self.rank)))

    def _deliver(self, bucket: int, out: torch.Tensor) -> None:
        """The summed chunk overwrites this rank's chunk of the full gradient."""
        self.part.own(self.grad_flat, bucket, self.rank).copy_(out)

    def zero_grads(self) -> None:
        self.grad_flat.zero_()

    def grad_ready(self, unit: Unit) -> None:
        if self.reduce_now:
            self.reducer.grad_ready(unit.index)

    def finish_reduction(self) -> None:
        self.reducer.finish()

    def after_step(self) -> None:
        all_gather_updated_params(self)


def flat_params(engine: ZeroEngine, init32: list[torch.Tensor]) -> torch.Tensor:
    """Stages 1-2: lay the units out bucket by bucket in one flat working buffer (`engine.flat`),
    each unit's parameter a leaf aliasing its slice; returns the fp32 initial values, same layout."""
    part = engine.part = BucketPartition.of([u.layout.numel for u in engine.units], engine.options.bucket_elements,
                                            engine.dp)
    flat32 = torch.zeros(part.total, dtype=torch.float32, device=engine.device)
    for u, values in zip(engine.units, init32):
        at = part.unit_offset[u.index]
        flat32[at:at + u.layout.numel] = values
    engine.flat = flat32.to(engine.dtype)
    engine.ledger.add("params", engine.flat.nbytes)
    for u in engine.units:
        at = part.unit_offset[u.index]
        u.param = engine.flat[at:at + u.layout.numel].requires_grad_(True)
    return flat32


def owned_segments(engine: ZeroEngine, grad_chunk) -> list[Segment]:
    """Stages 1-2: the optimizer's segments, one per bucket: this rank's chunk of the parameters,
    `grad_chunk(bucket)` and the fp32 initial values."""
    part = engine.part
    return [Segment(part.own(engine.flat, b, engine.rank), grad_chunk(b), part.own(engine.flat32, b, engine.rank))
            for b in range(len(part.buckets))]


def all_gather_updated_params(engine: ZeroEngine) -> None:
    """Stages 1-2: every rank updated its chunk of each bucket; gather the whole buckets, in place
    (this rank's input is its own chunk of the output), all issued before any is waited on."""
    part = engine.part
    pending = [engine.comm.all_gather(part.bucket_slice(engine.flat, b), part.own(engine.flat, b, engine.rank),
                                      f"params.bucket.{b}") for b in range(len(part.buckets))]
    for p in pending:
        p.wait()

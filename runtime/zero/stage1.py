"""Stage 1, Pos (ZeRO paper §5.1): optimizer states partitioned across the Nd DP ranks.

Each rank still holds all fp16/bf16 parameters (es·Ψ) and gradients (es·Ψ), but only 1/Nd of
the optimizer state (KΨ/Nd): memory (2 + 2 + K/Nd)Ψ mixed (Table 1). The plan is DeepSpeed v0.2's
(deepspeed/pt/zero_optimizer_stage1.py @ v0.2.0) and the simulator's (zsim/zero/plan.py): the
parameters live in one flat buffer padded to whole comm intervals (runtime/zero/partition.py), rank r
owning sub-partition r of every interval. Autograd accumulates the gradients into one unpadded flat
buffer. After the last micro-batch's backward (not overlapped with it) the gradients are copied into
a padded flat buffer and reduce-scattered interval by interval; each rank copies its summed
sub-partitions back, updates them, and all-gathers every interval after the step.
Communication per step: reduce-scatter Ψ + all-gather Ψ = 2Ψ, the same as plain DP (§7.2.1).
"""

from __future__ import annotations

import torch

from .engine import Unit, ZeroEngine
from .optimizer import FlatAdam, Segment
from .partition import BucketPartition


class Stage1(ZeroEngine):
    stage = 1
    partitioned = frozenset({"optimizer"})

    def setup(self, init32: list[torch.Tensor]) -> FlatAdam:
        numels = [u.layout.numel for u in self.units]
        # fp32 initial values, a local: the optimizer's master copies them and drops it (no hidden 4 B/param)
        flat32 = flat_params(self, init32, BucketPartition.intervals(numels, self.options.bucket_elements, self.dp))
        part, psi = self.part, self.params
        self.grad_flat = torch.zeros(psi, dtype=self.dtype, device=self.device)
        self.ledger.add("grads", self.grad_flat.nbytes)
        for u in self.units:
            at = part.unit_offset[u.index]
            u.param.grad = self.grad_flat[at:at + u.layout.numel]  # autograd accumulates in place
        # Sub-partitions that lie (partly) in the padding have a shorter gradient; Adam reads zeros there.
        return self._optimizer([Segment(part.own(self.flat, j, self.rank), self.grad_flat[slice(*self._real(j))],
                                        part.own(flat32, j, self.rank)) for j in range(part.pieces)])

    def _real(self, interval: int) -> tuple[int, int]:
        """[lo, hi) of this rank's sub-partition of `interval` that holds real gradients."""
        lo, hi = self.part.own_range(interval, self.rank)
        return min(lo, self.params), min(hi, self.params)

    def zero_grads(self) -> None:
        self.grad_flat.zero_()

    def grad_ready(self, unit: Unit) -> None:
        """Nothing yet: stage 1 reduces once backward is over (finish_reduction)."""

    def finish_reduction(self) -> None:
        """DeepSpeed v0.2 reduce_scatter_gradients: a padded flat copy of the gradients, then one
        reduce-scatter per comm interval, in order, each waited for before the next."""
        part = self.part
        padded = torch.zeros(part.total, dtype=self.dtype, device=self.device)
        padded[:self.params].copy_(self.grad_flat)
        self.ledger.add("buffers", padded.nbytes)
        for j in range(part.pieces):
            out = torch.empty(part.chunk(j), dtype=self.dtype, device=self.device)
            self.ledger.add("buffers", out.nbytes)
            self.comm.reduce_scatter(out, part.bucket_slice(padded, j), f"grads.bucket.{j}").wait()
            lo, hi = self._real(j)
            self.grad_flat[lo:hi].copy_(out[:hi - lo])
            self.ledger.add("buffers", -out.nbytes)
        self.ledger.add("buffers", -padded.nbytes)

    def after_step(self) -> None:
        """Every rank updated its sub-partitions; gather every interval in place (this rank's input is
        its own sub-partition of the output), all issued before any is waited on."""
        part = self.part
        pending = [self.comm.all_gather(part.bucket_slice(self.flat, j), part.own(self.flat, j, self.rank),
                                        f"params.bucket.{j}") for j in range(part.pieces)]
        for p in pending:
            p.wait()

    @property
    def grads_whole(self) -> int:
        return self.params  # autograd's gradients, unpadded (DeepSpeed v0.2: each parameter's .grad)


def flat_params(engine: ZeroEngine, init32: list[torch.Tensor], part: BucketPartition) -> torch.Tensor:
    """Stages 1-2: lay the units out in one flat working buffer (`engine.flat`) as `part` says, each
    unit's parameter a leaf aliasing its slice; returns the fp32 initial values, same layout."""
    engine.part = part
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

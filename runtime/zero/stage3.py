"""Stage 3, Pos+g+p (ZeRO paper §5.3): parameters partitioned too.

Each rank keeps only its chunks of the parameters, gradients and optimizer state: 16Ψ/Nd bytes
mixed (Table 1). Every parameter tensor is padded to a multiple of Nd and split on its own, as
DeepSpeed ZeRO-3 does (runtime/flat.py). The schedule is the simulator's (zsim/zero/plan.py):
in each phase (a micro-batch's forward, then its backward) the units are gathered in the order of
their first use, `prefetch_layers` units ahead: when a unit starts, the gathers up to the one
`prefetch_layers` beyond it are issued, then the unit waits for its own (recorded as a `wait/`
event, never inside its compute span). A unit is released after its last use in the phase; a tied
head uses the embedding, which therefore stays gathered from the embedding's forward to the head's,
and from the head's backward to the embedding's. Autograd's saved views of the parameters are kept
as positions (activations.ParamRef), so a released buffer is really freed. Gradients are
reduce-scattered in buckets (zsim.zero.buckets.plan_buckets, as DeepSpeed's reduce_bucket_size), and
the optimizer updates the parameter chunks in place: no all-gather after the step.
Communication per step: all-gather Ψ (forward) + Ψ (backward) + reduce-scatter Ψ = 3Ψ (§7.2.2).
"""

from __future__ import annotations

import torch

from ..comm import Pending
from .activations import SavedTensors
from .buckets import ReduceScatterBuckets, plan_buckets
from .engine import PartitionedGradients, Unit, unit_what
from .optimizer import FlatAdam, Segment


class Stage3(PartitionedGradients):
    stage = 3
    partitioned = frozenset({"optimizer", "grads", "params"})
    pads_tensors = True

    def setup(self, init32: list[torch.Tensor]) -> FlatAdam:
        self.param_shards, owned32 = [], []
        for u, values in zip(self.units, init32):
            owned32.append(u.layout.rank_major(values)[self.rank].contiguous())
            self.param_shards.append(owned32[-1].to(self.dtype))
            self.ledger.add("params", self.param_shards[-1].nbytes)
            u.param = torch.empty(0, dtype=self.dtype, device=self.device).requires_grad_(True)
        self._gathering: dict[int, tuple[Pending, torch.Tensor]] = {}
        self._phase: tuple[str, int, int] | None = None
        self.partition_offsets, total = [], 0
        for u in self.units:
            self.partition_offsets.append(total)
            total += u.layout.shard
        self.grad_partition = torch.zeros(total, dtype=self.dtype, device=self.device)
        self.ledger.add("grads", self.grad_partition.nbytes)
        self.reducer = ReduceScatterBuckets(
            plan_buckets([u.layout.numel for u in self.units], self.options.bucket_elements),
            [u.layout for u in self.units], self.comm, self.ledger, self._deliver, self.dtype, self.device)
        grads = [self.grad_partition[o:o + u.layout.shard] for u, o in zip(self.units, self.partition_offsets)]
        return self._optimizer([Segment(p, g, i) for p, g, i in zip(self.param_shards, grads, owned32)])

    def _saved_tensors(self) -> SavedTensors:
        def param_unit(ptr: int) -> int | None:
            return next((u.index for u in self.units if u.param.numel()
                         and u.param.untyped_storage().data_ptr() == ptr), None)
        return SavedTensors(param_unit, fetch=self._gathered)

    # --- gradients -------------------------------------------------------------------------------
    def _deliver(self, bucket: int, out: torch.Tensor) -> None:
        """A bucket's units are consecutive, so their chunks are one slice of the partition."""
        start = self.partition_offsets[self.reducer.buckets[bucket][0]]
        self.grad_partition[start:start + out.numel()].add_(out)

    # --- gather and release ----------------------------------------------------------------------
    def _issue_gather(self, u: Unit) -> None:
        if u.index in self._gathering or u.param.numel():
            return
        rows = torch.empty(self.dp, u.layout.shard, dtype=self.dtype, device=self.device)
        self.ledger.add("buffers", rows.nbytes)  # rank-major, until copied into the parameter buffer
        full = torch.empty(u.layout.padded, dtype=self.dtype, device=self.device)
        self.ledger.add("params", full.nbytes)
        pending = self.comm.all_gather(rows.view(-1), self.param_shards[u.index], f"params.{unit_what(u)}")
        self._gathering[u.index] = (pending, rows)
        u.param.data = full  # in place now, so saved-tensor hooks recognise its storage; read only after wait

    def _gathered(self, index: int) -> torch.Tensor:
        """Unit `index`'s whole parameter buffer, gathering it first if needed."""
        u = self.units[index]
        self._issue_gather(u)
        entry = self._gathering.pop(index, None)
        if entry is not None:
            pending, rows = entry
            pending.wait()
            u.layout.from_rank_major(rows, u.param.data)
            self.ledger.add("buffers", -rows.nbytes)
        return u.param.data

    def _release(self, u: Unit) -> None:
        assert u.index not in self._gathering, "releasing a unit whose gather is still in flight"
        self.ledger.add("params", -u.param.nbytes)
        u.param.data = torch.empty(0, dtype=self.dtype, device=self.device)

    def _phase_order(self, phase: str) -> list[int]:
        """Units in the order of their first use in `phase` (zsim/zero/plan.py _uses_of)."""
        items = range(len(self.units)) if phase == "fwd" else reversed(range(len(self.units)))
        order: list[int] = []
        for i in items:
            order += [x for x in self.uses[i] if x not in order]
        return order

    def _last_use(self, phase: str) -> dict[int, int]:
        """unit -> the unit after whose compute in `phase` it is released."""
        items = range(len(self.units)) if phase == "fwd" else reversed(range(len(self.units)))
        return {x: i for i in items for x in self.uses[i]}

    def _enter(self, phase: str, unit: Unit) -> None:
        """`unit` starts computing in `phase`: issue the gathers up to `prefetch_layers` units beyond
        the ones it uses, in first-use order, then wait for its own."""
        if self._phase is None or self._phase[0] != phase:
            self._phase = (phase, 0, 0)  # (phase, gathers issued, units whose first use has started)
            self._order, self._started = self._phase_order(phase), set()
        self._started.update(self.uses[unit.index])
        ahead = self.options.prefetch_layers
        _, issued, _ = self._phase
        while issued < len(self._order) and (issued < ahead or self._order[issued - ahead] in self._started):
            self._issue_gather(self.units[self._order[issued]])
            issued += 1
        self._phase = (phase, issued, 0)
        for x in self.uses[unit.index]:
            self._gathered(x)

    def _leave(self, phase: str, unit: Unit) -> None:
        last = self._last_use(phase)
        for x in self.uses[unit.index]:
            if last[x] == unit.index:
                self._release(self.units[x])

    def before_forward(self, unit: Unit) -> None:
        self._enter("fwd", unit)

    def after_forward(self, unit: Unit) -> None:
        self._leave("fwd", unit)

    def before_backward(self, unit: Unit) -> None:
        self._enter("bwd", unit)

    def after_backward(self, unit: Unit) -> None:
        self._leave("bwd", unit)
        if unit.index == 0:
            self._phase = None  # the micro-batch's backward is over

    def after_step(self) -> None:
        """The optimizer wrote the parameter shards in place; the next forward gathers them."""

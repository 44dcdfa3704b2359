"""Gradient buckets: which units reduce together, and the bucketed reducers.

Units become ready in backward order (head first), so buckets are formed from the last unit
backwards, closing once they hold `capacity` elements (a unit is never split; DeepSpeed's
reduce_bucket_size). The rule is `zsim.zero.buckets.plan_buckets`, which the simulator's plan uses
too. A bucket is launched as soon as all its units have their gradients, while backward goes on
with earlier layers (overlap, ZeRO paper §5.2 "bucketization strategy").
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..comm import Collectives, Pending
from ..flat import FlatLayout
from ..ledger import MemoryLedger
from .partition import BucketPartition
from zsim.zero.buckets import plan_buckets

__all__ = ["AllReduceBuckets", "PartitionReducer", "ReduceScatterBuckets", "plan_buckets"]


class AllReduceBuckets:
    """Stage 0: all-reduce each bucket in place, on its slice of the contiguous gradient buffer."""

    def __init__(self, buckets: list[list[int]], offsets: list[int], elements: list[int],
                 grad_buffer: torch.Tensor, comm: Collectives, names: list[str] | None = None):
        """`names`: each bucket's event name (default `grads.bucket.<b>`); a pipeline stage's numbers
        restart per model chunk (runtime/zero/stage0.py)."""
        self.buckets = buckets
        self.names = names or [f"grads.bucket.{b}" for b in range(len(buckets))]
        self.bucket_of = {u: b for b, units in enumerate(buckets) for u in units}
        self._range = [(offsets[units[0]], offsets[units[-1]] + elements[units[-1]]) for units in buckets]
        self._buffer = grad_buffer
        self._comm = comm
        self._ready = [0] * len(buckets)
        self._pending: list[Pending] = []

    def grad_ready(self, unit: int) -> None:
        b = self.bucket_of[unit]
        self._ready[b] += 1
        if self._ready[b] == len(self.buckets[b]):
            self._ready[b] = 0
            lo, hi = self._range[b]
            self._pending.append(self._comm.all_reduce(self._buffer[lo:hi], self.names[b]))

    def finish(self) -> None:
        """Wait for every bucket; the gradient buffer then holds the sum over ranks."""
        assert not any(self._ready), "a bucket never filled"
        for pending in self._pending:
            pending.wait()
        self._pending.clear()


class PartitionReducer:
    """Stages 1-2: reduce-scatter each bucket of the flat partition (runtime/zero/partition.py) and
    hand this rank's summed chunk to `deliver(bucket, out)`. Stage 1 reduces straight from its full
    gradient buffer `source`; stage 2 (source None) copies each unit's gradient, as it becomes ready,
    into a bucket buffer (only its padding is zeroed). At most two buckets are in flight; bucket and
    output buffers count as `buffers`."""

    def __init__(self, part: BucketPartition, comm: Collectives, ledger: MemoryLedger,
                 deliver: Callable[[int, torch.Tensor], None], dtype: torch.dtype, device: torch.device,
                 source: torch.Tensor | None = None):
        self.part = part
        self.buckets = part.buckets
        self.bucket_of = {u: b for b, units in enumerate(part.buckets) for u in units}
        self._source = source
        self._comm, self._ledger, self._deliver = comm, ledger, deliver
        self._dtype, self._device = dtype, device
        self._buffer: dict[int, torch.Tensor] = {}
        self._ready = [0] * len(part.buckets)
        self._inflight: list[tuple[int, Pending, torch.Tensor | None, torch.Tensor]] = []

    def grad_ready(self, unit: int, grad: torch.Tensor | None = None) -> None:
        """Unit `unit`'s gradient is complete (stage 2: `grad`, copied, so the caller may free it)."""
        b = self.bucket_of[unit]
        if self._source is None:
            if b not in self._buffer:
                # DeepSpeed's ipg buffer is torch.empty (every real element is written by a copy): zero
                # only the padding, which the reduce-scatter must see as zeros
                self._buffer[b] = torch.empty(self.part.bucket_padded[b], dtype=self._dtype, device=self._device)
                self._buffer[b][self.part.bucket_real[b]:].zero_()
                self._ledger.add("buffers", self._buffer[b].nbytes)
            at = self.part.unit_offset[unit] - self.part.bucket_offset[b]
            self._buffer[b][at:at + grad.numel()].copy_(grad)
        self._ready[b] += 1
        if self._ready[b] == len(self.buckets[b]):
            self._ready[b] = 0
            self._complete_inflight()
            staging = self._buffer.pop(b, None)
            bucket = staging if staging is not None else self.part.bucket_slice(self._source, b)
            out = torch.empty(self.part.chunk(b), dtype=self._dtype, device=self._device)
            self._ledger.add("buffers", out.nbytes)
            pending = self._comm.reduce_scatter(out, bucket, f"grads.bucket.{b}")
            self._inflight.append((b, pending, staging, out))

    def finish(self) -> None:
        """Wait for every bucket and deliver it."""
        assert not self._buffer and not any(self._ready), "a bucket never filled"
        self._complete_inflight()

    def _complete_inflight(self) -> None:
        for b, pending, staging, out in self._inflight:
            pending.wait()
            self._deliver(b, out)
            self._ledger.add("buffers", -(out.nbytes + (staging.nbytes if staging is not None else 0)))
        self._inflight.clear()


class ReduceScatterBuckets:
    """Stage 3: copy each unit's gradient into its bucket rank-major (row r = the chunks rank r
    owns, runtime/flat.py), reduce-scatter the bucket, and hand this rank's summed chunks to
    `deliver(bucket, out)`.

    At most two buckets are in flight: launching one first completes the one before (double
    buffering), so bucket memory stays bounded. Bucket and output buffers count as `buffers`.
    """

    def __init__(self, buckets: list[list[int]], layouts: list[FlatLayout], comm: Collectives, ledger: MemoryLedger,
                 deliver: Callable[[int, torch.Tensor], None], dtype: torch.dtype, device: torch.device):
        self.buckets = buckets
        self.bucket_of = {u: b for b, units in enumerate(buckets) for u in units}
        self._layouts = layouts
        shards = [layout.shard for layout in layouts]
        self._shards = shards
        self._column = {}  # unit -> first column of its shard in its bucket
        self._width = []  # bucket -> elements per rank
        for units in buckets:
            col = 0
            for u in units:
                self._column[u] = col
                col += shards[u]
            self._width.append(col)
        self._comm, self._ledger, self._deliver = comm, ledger, deliver
        self._dtype, self._device = dtype, device
        self._buffer: dict[int, torch.Tensor] = {}
        self._ready = [0] * len(buckets)
        self._inflight: list[tuple[int, Pending, torch.Tensor, torch.Tensor]] = []

    def grad_ready(self, unit: int, grad: torch.Tensor) -> None:
        """`grad` is the unit's whole (padded) gradient; it is copied, so the caller may free it."""
        b = self.bucket_of[unit]
        if b not in self._buffer:
            self._buffer[b] = torch.empty(self._comm.size, self._width[b], dtype=self._dtype, device=self._device)
            self._ledger.add("buffers", self._buffer[b].nbytes)
        col, shard = self._column[unit], self._shards[unit]
        self._layouts[unit].copy_rank_major(grad, self._buffer[b][:, col:col + shard])
        self._ready[b] += 1
        if self._ready[b] == len(self.buckets[b]):
            self._ready[b] = 0
            self._complete_inflight()
            bucket = self._buffer.pop(b)
            out = torch.empty(self._width[b], dtype=self._dtype, device=self._device)
            self._ledger.add("buffers", out.nbytes)
            pending = self._comm.reduce_scatter(out, bucket.view(-1), f"grads.bucket.{b}")
            self._inflight.append((b, pending, bucket, out))

    def finish(self) -> None:
        """Wait for every bucket and deliver it."""
        assert not self._buffer and not any(self._ready), "a bucket never filled"
        self._complete_inflight()

    def _complete_inflight(self) -> None:
        for b, pending, bucket, out in self._inflight:
            pending.wait()
            self._deliver(b, out)
            self._ledger.add("buffers", -(bucket.nbytes + out.nbytes))
        self._inflight.clear()

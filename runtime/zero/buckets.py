"""Gradient buckets: which units reduce together, and the two bucketed reducers.

Units become ready in backward order (head first), so buckets are formed from the last unit
backwards, closing once they hold `capacity` elements (a unit is never split; DeepSpeed's
reduce_bucket_size). A bucket is launched as soon as all its units have their gradients, while
backward goes on with earlier layers (overlap, ZeRO paper §5.2 "bucketization strategy").
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..comm import Collectives, Pending
from ..ledger import MemoryLedger


def plan_buckets(elements: list[int], capacity: int) -> list[list[int]]:
    """Unit indices per bucket, bucket 0 first to reduce; units ascending within a bucket."""
    buckets: list[list[int]] = []
    current: list[int] = []
    size = 0
    for unit in reversed(range(len(elements))):
        current.append(unit)
        size += elements[unit]
        if size >= capacity:
            buckets.append(sorted(current))
            current, size = [], 0
    if current:
        buckets.append(sorted(current))
    return buckets


class AllReduceBuckets:
    """Stage 0: all-reduce each bucket in place, on its slice of the contiguous gradient buffer."""

    def __init__(self, buckets: list[list[int]], offsets: list[int], elements: list[int],
                 grad_buffer: torch.Tensor, comm: Collectives):
        self.buckets = buckets
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
            self._pending.append(self._comm.all_reduce(self._buffer[lo:hi], f"grads.bucket.{b}"))

    def finish(self) -> None:
        """Wait for every bucket; the gradient buffer then holds the sum over ranks."""
        assert not any(self._ready), "a bucket never filled"
        for pending in self._pending:
            pending.wait()
        self._pending.clear()


class ReduceScatterBuckets:
    """Stages 1-3: copy each unit's gradient into its bucket rank-major (row r = the shards rank r
    owns), reduce-scatter the bucket, and hand this rank's summed shards to `deliver(bucket, out)`.

    At most two buckets are in flight: launching one first completes the one before (double
    buffering), so bucket memory stays bounded. Bucket and output buffers count as `buffers`.
    """

    def __init__(self, buckets: list[list[int]], shards: list[int], comm: Collectives, ledger: MemoryLedger,
                 deliver: Callable[[int, torch.Tensor], None], dtype: torch.dtype, device: torch.device):
        self.buckets = buckets
        self.bucket_of = {u: b for b, units in enumerate(buckets) for u in units}
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
        self._buffer[b][:, col:col + shard].copy_(grad.view(self._comm.size, shard))
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

"""Stages 1-2: where the units' parameters live in one flat buffer, and which part each rank owns.

The layout is the simulator's (`zsim.zero.buckets.flat_pieces`, one plan for both): the flat buffer
is cut into pieces, every piece padded to a multiple of Nd, and rank r owns chunk r (1/Nd) of every
piece. A piece's reduce-scatter leaves each rank the summed gradient of its chunk.

  stage 1 (`BucketPartition.intervals`): DeepSpeed v0.2's comm intervals. The units follow each other
      in forward order from offset 0, and the buffer is padded at its end to whole intervals of
      min(bucket, Ψ) // Nd · Nd elements; piece j is interval j (from the embedding's end).
  stage 2 (`BucketPartition.of`): the gradient buckets of `zsim.zero.buckets.plan_buckets` (bucket 0
      holds the head and is the first to reduce), each padded to a multiple of 2·Nd; the buckets lie
      in forward order (the last bucket, with the embedding, first), the units of a bucket one after
      another. With one bucket this is DeepSpeed's flat partition (the whole buffer padded to 2·Nd).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from zsim.zero.buckets import flat_pieces, plan_buckets


@dataclass(frozen=True)
class BucketPartition:
    """The flat layout of stages 1-2 (see the module docstring); all sizes in elements. "Bucket" b is
    piece b: a gradient bucket (stage 2) or a comm interval (stage 1)."""

    buckets: list[list[int]]  # stage 2: unit indices per bucket, bucket 0 first to reduce; stage 1: []
    unit_offset: list[int]  # unit -> its first element in the flat buffer
    bucket_offset: list[int]  # piece -> its first element
    bucket_real: list[int]  # piece -> its real (not padding) elements
    bucket_padded: list[int]  # piece -> elements once padded
    total: int  # elements of the flat buffer
    nd: int

    @classmethod
    def of(cls, unit_elements: list[int], capacity: int, nd: int) -> BucketPartition:
        """Stage 2: one piece per gradient bucket."""
        buckets = plan_buckets(unit_elements, capacity)
        unit_offset = [0] * len(unit_elements)
        bucket_offset = [0] * len(buckets)
        real = [sum(unit_elements[u] for u in units) for units in buckets]
        padded = flat_pieces(2, unit_elements, nd, capacity)
        at = 0
        for b in reversed(range(len(buckets))):  # forward order in memory
            bucket_offset[b] = at
            for u in buckets[b]:
                unit_offset[u] = at
                at += unit_elements[u]
            at = bucket_offset[b] + padded[b]
        return cls(buckets, unit_offset, bucket_offset, real, padded, at, nd)

    @classmethod
    def intervals(cls, unit_elements: list[int], capacity: int, nd: int) -> BucketPartition:
        """Stage 1: one piece per comm interval of DeepSpeed v0.2."""
        padded = flat_pieces(1, unit_elements, nd, capacity)
        psi = sum(unit_elements)
        unit_offset = [sum(unit_elements[:u]) for u in range(len(unit_elements))]
        offsets = [sum(padded[:j]) for j in range(len(padded))]
        real = [max(0, min(n, psi - at)) for at, n in zip(offsets, padded)]
        return cls([], unit_offset, offsets, real, padded, sum(padded), nd)

    @property
    def pieces(self) -> int:
        return len(self.bucket_padded)

    def chunk(self, bucket: int) -> int:
        """Elements each rank owns of `bucket`."""
        return self.bucket_padded[bucket] // self.nd

    def bucket_slice(self, flat: torch.Tensor, bucket: int) -> torch.Tensor:
        lo = self.bucket_offset[bucket]
        return flat[lo:lo + self.bucket_padded[bucket]]

    def own_range(self, bucket: int, rank: int) -> tuple[int, int]:
        """[lo, hi) of rank `rank`'s chunk of `bucket` in the flat buffer."""
        lo = self.bucket_offset[bucket] + rank * self.chunk(bucket)
        return lo, lo + self.chunk(bucket)

    def own(self, flat: torch.Tensor, bucket: int, rank: int) -> torch.Tensor:
        """Rank `rank`'s chunk of `bucket` in the flat buffer `flat` (a view)."""
        lo, hi = self.own_range(bucket, rank)
        return flat[lo:hi]

    def partition_pieces(self, start: int, elements: int, rank: int) -> list[tuple[int, int, int]]:
        """Where elements [start, start + elements) of rank `rank`'s partition (its chunks, piece by
        piece) lie in the flat buffer: (flat offset, offset in the range, length) per stretch."""
        out, at = [], 0  # `at`: the partition index where piece b's chunk begins
        for b in range(self.pieces):
            c = self.chunk(b)
            lo, hi = max(start, at), min(start + elements, at + c)
            if lo < hi:
                out.append((self.own_range(b, rank)[0] + lo - at, lo - start, hi - lo))
            at += c
        return out

    @property
    def shard(self) -> int:
        """Elements each rank owns over all pieces."""
        return sum(self.chunk(b) for b in range(self.pieces))

    def shard_real(self, rank: int) -> int:
        """Real (not padding) elements of rank `rank`'s chunks."""
        return sum(max(0, min(n, (rank + 1) * self.chunk(b)) - rank * self.chunk(b))
                   for b, n in enumerate(self.bucket_real))

"""Stages 1-2: where the units' parameters live in one flat buffer, and which part each rank owns.

The units are grouped into the gradient buckets of `zsim.zero.buckets.plan_buckets` (the simulator
uses the same function): bucket 0 holds the head and is the first to reduce. The flat buffer holds
the buckets in forward order (the last bucket, with the embedding, first); inside a bucket the units
follow each other, and the bucket is padded to a multiple of 2·Nd (`zsim.zero.buckets.padded_bucket`).
Rank r owns chunk r (1/Nd) of every bucket: a bucket's reduce-scatter leaves each rank the summed
gradient of its chunk, and the all-gather after the step rebuilds the bucket in place. With one
bucket (every model of up to `bucket_elements` parameters per MP rank) this is exactly DeepSpeed's
flat partition (the whole buffer padded to 2·Nd, deepspeed/runtime/zero/stage_1_and_2.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from zsim.zero.buckets import padded_bucket, plan_buckets


@dataclass(frozen=True)
class BucketPartition:
    """The flat layout of stages 1-2 (see the module docstring); all sizes in elements."""

    buckets: list[list[int]]  # unit indices per bucket, bucket 0 first to reduce
    unit_offset: list[int]  # unit -> its first element in the flat buffer
    bucket_offset: list[int]  # bucket -> its first element
    bucket_real: list[int]  # bucket -> its units' elements
    bucket_padded: list[int]  # bucket -> elements once padded
    total: int  # elements of the flat buffer
    nd: int

    @classmethod
    def of(cls, unit_elements: list[int], capacity: int, nd: int) -> BucketPartition:
        buckets = plan_buckets(unit_elements, capacity)
        unit_offset = [0] * len(unit_elements)
        bucket_offset = [0] * len(buckets)
        real = [sum(unit_elements[u] for u in units) for units in buckets]
        padded = [padded_bucket(n, nd) for n in real]
        at = 0
        for b in reversed(range(len(buckets))):  # forward order in memory
            bucket_offset[b] = at
            for u in buckets[b]:
                unit_offset[u] = at
                at += unit_elements[u]
            at = bucket_offset[b] + padded[b]
        return cls(buckets, unit_offset, bucket_offset, real, padded, at, nd)

    def chunk(self, bucket: int) -> int:
        """Elements each rank owns of `bucket`."""
        return self.bucket_padded[bucket] // self.nd

    def bucket_slice(self, flat: torch.Tensor, bucket: int) -> torch.Tensor:
        lo = self.bucket_offset[bucket]
        return flat[lo:lo + self.bucket_padded[bucket]]

    def own(self, flat: torch.Tensor, bucket: int, rank: int) -> torch.Tensor:
        """Rank `rank`'s chunk of `bucket` in the flat buffer `flat` (a view)."""
        c = self.chunk(bucket)
        lo = self.bucket_offset[bucket] + rank * c
        return flat[lo:lo + c]

    @property
    def shard(self) -> int:
        """Elements each rank owns over all buckets."""
        return sum(self.chunk(b) for b in range(len(self.buckets)))

    def shard_real(self, rank: int) -> int:
        """Real (not padding) elements of rank `rank`'s chunks."""
        return sum(max(0, min(n, (rank + 1) * self.chunk(b)) - rank * self.chunk(b))
                   for b, n in enumerate(self.bucket_real))

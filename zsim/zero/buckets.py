"""Gradient buckets and padded collective sizes: the one rule the simulator's plan and the runtime
(runtime/zero/) share, so that every bucket and every byte of a measured step has its simulated twin.

Buckets hold whole modules (the embedding, a block, the head). Modules finish backward in reverse
order, so buckets are formed from the last module backwards and close once they hold `capacity`
elements (DeepSpeed's reduce_bucket_size; DeepSpeed closes a bucket *before* a parameter would
overflow it and may split nothing either: deepspeed/runtime/zero/stage_1_and_2.py
reduce_independent_p_g_buckets_and_remove_grads). Bucket 0 is the first to reduce (it holds the head).

Padding, as DeepSpeed pads (zsim.zero.model_states cites the code):
  stages 1-2: a bucket is padded to a multiple of 2·Nd elements and rank r owns its r-th 1/Nd
      (DeepSpeed pads the whole flat buffer once; with one bucket, the default for every model up to
      5e8 parameters per MP rank, the two are the same partition);
  stage 3: every parameter tensor is padded to a multiple of Nd and split on its own.
"""

from __future__ import annotations

from collections.abc import Sequence

from zsim.zero.model_states import FLAT_ALIGNMENT, partition


def plan_buckets(elements: Sequence[int], capacity: int) -> list[list[int]]:
    """Module indices per bucket, bucket 0 first to reduce; ascending module order within a bucket.
    `elements[i]` is module i's parameter count (forward order)."""
    if capacity <= 0:
        raise ValueError(f"capacity(={capacity}) must be > 0")
    buckets: list[list[int]] = []
    current: list[int] = []
    size = 0
    for module in reversed(range(len(elements))):
        current.append(module)
        size += elements[module]
        if size >= capacity:
            buckets.append(sorted(current))
            current, size = [], 0
    if current:
        buckets.append(sorted(current))
    return buckets


def padded_bucket(elements: int, nd: int) -> int:
    """Elements of a stage 1-2 bucket of `elements` once padded for Nd = `nd` ranks: a multiple of
    2·Nd (4-byte aligned fp16 partitions, DeepSpeed nccl_start_alignment_factor); unpadded for nd = 1."""
    if nd == 1:
        return elements
    return FLAT_ALIGNMENT * nd * partition(elements, FLAT_ALIGNMENT * nd)


def padded_tensors(tensors: Sequence[int], nd: int) -> int:
    """Elements of a stage-3 module gathered or reduced over Nd = `nd` ranks: each tensor padded to a
    multiple of Nd (DeepSpeed partition_parameters.py _padding_size)."""
    return sum(nd * partition(n, nd) for n in tensors)

"""Gradient buckets, the stage 1-2 flat layout and padded collective sizes: the one plan the
simulator (zsim.zero.plan) and the runtime (runtime/zero/) share, so that every bucket and every byte
of a measured step has its simulated twin. docs/runtime.md ("One ZeRO plan") tells the plan whole.

Buckets hold whole modules (the embedding, a block, the head). Modules finish backward in reverse
order, so buckets are formed from the last module backwards and close once they hold `capacity`
elements (DeepSpeed's reduce_bucket_size; DeepSpeed closes a bucket *before* a parameter would
overflow it and may split nothing either: deepspeed/runtime/zero/stage_1_and_2.py
reduce_independent_p_g_buckets_and_remove_grads). Bucket 0 is the first to reduce (it holds the head).

The flat buffer of stages 1-2 (all parameters of an MP rank, T elements once padded) is cut into
*pieces*; rank r owns the r-th 1/Nd of every piece, and each piece is one reduce-scatter:
  stage 1: DeepSpeed v0.2's comm intervals (deepspeed/pt/zero_optimizer_stage1.py @ v0.2.0:
      flatten_dense_tensors_sub_partition_aligned, get_data_parallel_sub_partitions): the buffer, in
      forward order, is padded to whole intervals of min(bucket, Ψ) // Nd · Nd elements; after the
      last backward every interval is reduce-scattered in order, and after the step all-gathered;
  stage 2: the gradient buckets, each padded to a multiple of 2·Nd (4-byte aligned fp16 chunks,
      DeepSpeed nccl_start_alignment_factor), reduce-scattered as soon as backward fills them. Here
      the plan differs from DeepSpeed v0.2 (deepspeed/pt/deepspeed_zero_optimizer.py), which pads
      the whole buffer once, gives rank r the r-th contiguous 1/Nd of it, and sends each bucket's
      slices to their owners with one dist.reduce per owner: the bytes on the wire are the same up to
      the padding, the ops fewer and equal on every rank. With one bucket the partitions coincide.
      After the step the rank's partition is all-gathered in DeepSpeed v0.2's shards
      (allgather_shards);
  without constant buffers (CB off, ZeRO §3.2), one piece: the whole buffer padded to 2·Nd.
Stage 3 pads every parameter tensor to a multiple of Nd and splits it on its own.
"""

from __future__ import annotations

from collections.abc import Sequence

from zsim.zero.model_states import FLAT_ALIGNMENT, partition
from zsim.zero.residual import stage1_comm_intervals


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


def flat_pieces(stage: int, module_elements: Sequence[int], nd: int, capacity: int,
                constant_buffers: bool = True) -> list[int]:
    """Stages 1-2: the padded elements of each piece of the flat buffer, in reduction order (see the
    module docstring); their sum is T, the padded buffer, and every rank owns 1/Nd of each piece.
    `module_elements[i]` is module i's parameter count (forward order), `capacity` the reduce bucket.

    Raises:
        ValueError: a stage other than 1 or 2, or capacity <= 0.
    """
    if stage not in (1, 2):
        raise ValueError(f"stage(={stage}): only stages 1 and 2 lay their states out in flat pieces")
    if capacity <= 0:
        raise ValueError(f"capacity(={capacity}) must be > 0")
    psi = sum(module_elements)
    if not constant_buffers:
        return [padded_bucket(psi, nd)]
    if stage == 1:
        intervals, sub = stage1_comm_intervals(psi, nd, capacity)
        return [sub * nd] * intervals
    return [padded_bucket(sum(module_elements[i] for i in b), nd) for b in plan_buckets(module_elements, capacity)]


def allgather_shards(partition: int, nd: int, bucket: int) -> list[int]:
    """Stage 2: elements per rank of each all-gather of the updated parameters after the step, as
    DeepSpeed v0.2 cuts the rank's partition of P = `partition` elements (deepspeed_zero_optimizer.py
    @ v0.2.0 step(): num_shards = max(1, P·Nd // allgather_bucket_size), shards of P // num_shards,
    the last one taking the rest). Each gathers that many elements from every rank. At most P shards
    (DeepSpeed would issue empty ones for a bucket below Nd)."""
    shards = min(max(1, partition * nd // bucket), max(1, partition))
    size = partition // shards
    return [size] * (shards - 1) + [partition - (shards - 1) * size]

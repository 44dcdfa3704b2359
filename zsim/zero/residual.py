"""Residual-state sizes (ZeRO §3.2 and §6, ZeRO-R): activation checkpoints under Pa and Pa+cpu,
temporary buffers with and without CB, and MD's pre-allocated arenas. Bytes per GPU; pure functions
that the plan (zsim.zero.plan) and the calculators (zsim memory, zsim maxsize) share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

FP32_BYTES = 4


def checkpoint_segments(layers: int, every: int) -> int:
    """Checkpoints kept per micro-batch with one checkpoint every `every` layers: ceil(L / k)
    (Megatron-LM's uniform recompute of checkpoint_num_layers layers; Chen et al. 2016 §4.1)."""
    return math.ceil(layers / every)


def checkpoint_bytes_per_rank(checkpoint_bytes: int, mp: int, partitioned: bool) -> int:
    """One checkpoint's bytes on one GPU: the whole layer input is replicated across the MP group, and
    Pa keeps 1/mp of it per rank (ZeRO §6.1; DeepSpeed activation_checkpointing/checkpointing.py
    partitions the flattened input into mp equal parts, the last one padded: ceil)."""
    return math.ceil(checkpoint_bytes / mp) if partitioned else checkpoint_bytes


def fused_gradient_buffer_bytes(elements: int) -> int:
    """Without CB, gradients are fused into one flattened fp32 buffer for the reduction: 4 bytes per
    element (ZeRO §3.2: "a flattened fp32 buffer" for a 1.5B model "would require 6 GB")."""
    return FP32_BYTES * elements


def bucket_buffer_bytes(bucket_elements: int, elements: int, param_bytes: int) -> int:
    """With CB, one gradient bucket's staging buffer: min(bucket, Ψ) elements in the gradient dtype,
    independent of the model size once Ψ exceeds the bucket (ZeRO §6.2; DeepSpeed reduce_bucket_size)."""
    return param_bytes * min(bucket_elements, elements)


@dataclass(frozen=True, slots=True)
class StepGradients:
    """What the optimizer step holds beyond the model states, as DeepSpeed of the paper's time does it:
    `held` bytes from the gradients' conversion to the end of the Adam update, and `transient` bytes
    only while the conversion runs (the copy it is made from)."""

    held: int
    transient: int


def step_gradient_bytes(stage: int, partition: int, dtype: str, sub_group: int) -> StepGradients:
    """The gradient copies of the optimizer step on one GPU (0 for fp32 training, whose Adam reads the
    fp32 gradients in place). `partition` is the rank's model-state partition in elements (Ψ at stage 0).

      stage 0: DeepSpeed v0.2 fp16_optimizer.py step_fused_adam flattens all fp16 gradients into one
          buffer that FusedAdam reads: e·Ψ held, nothing upcast;
      stage 1: v0.2 zero_optimizer_stage1.py step: get_flat_sub_partitions(dtype=fp32) converts each
          gradient piece of the partition to fp32 (`tensor.to(dtype)`) and concatenates them: 4·P
          held, and the 4·P of pieces while the concatenation runs;
      stage 2: v0.2 deepspeed_zero_optimizer.py step: `_flatten_dense_tensors(averaged_gradients).to(fp32)`:
          4·P held, the e·P fp16 flat copy while it converts;
      stage 3: v0.3.13 stage3.py _prepare_fp32_grad_for_sub_group: the same, one sub-group of
          min(P, sub_group_size) elements at a time (its default 1e12 is the whole partition).
    """
    if dtype == "fp32":
        return StepGradients(0, 0)
    e = 2
    if stage == 0:
        return StepGradients(e * partition, 0)
    if stage == 1:
        return StepGradients(FP32_BYTES * partition, FP32_BYTES * partition)
    n = partition if stage == 2 else min(partition, sub_group)
    return StepGradients(FP32_BYTES * n, e * n)


def stage1_comm_intervals(psi: int, nd: int, bucket: int) -> tuple[int, int]:
    """(comm intervals, sub-partition elements) of DeepSpeed v0.2's stage 1 (zero_optimizer_stage1.py
    flatten_dense_tensors_sub_partition_aligned, get_data_parallel_sub_partitions): a comm interval is
    min(bucket, Ψ) elements cut into Nd sub-partitions of min(bucket, Ψ) // Nd; Ψ is padded to whole
    intervals, and each rank owns one sub-partition of every interval."""
    sub = max(1, min(bucket, psi) // nd)
    return math.ceil(psi / (sub * nd)), sub


def stage1_flat_gradient_bytes(psi: int, nd: int, bucket: int, param_bytes: int) -> int:
    """DeepSpeed v0.2 stage 1 reduce_scatter_gradients: for every rank and comm interval,
    get_flat_sub_partitions flattens that sub-partition's gradients into a new tensor, and all of them
    live until every interval is reduced: a second, padded copy of all Ψ gradients (e bytes each)."""
    intervals, sub = stage1_comm_intervals(psi, nd, bucket)
    return param_bytes * intervals * sub * nd


def list_collective_staging_bytes(elements: int, param_bytes: int) -> int:
    """PyTorch's ProcessGroupNCCL runs all_gather / reduce_scatter on a *list* of tensors through one
    flat buffer of all of them (flatten_for_scatter_gather, torch/lib/c10d/ProcessGroupNCCL.cpp), then
    copies out: `elements` (the whole collective, every rank's share) of e bytes while the call runs.
    DeepSpeed's stage 1/2 all-gathers after the step, stage 1's reduce-scatters and stage 3's
    parameter gathers use the list API."""
    return param_bytes * elements


def md_arena_bytes(stage: int, param_bytes: int, psi: int, bucket_elements: int, constant_buffers: bool,
                   overlap_comm: bool = True) -> dict[str, int]:
    """MD's contiguous gradient buffer (ZeRO §6.3), bytes, as reserved at the start of the run (stages
    2/3; none before): DeepSpeed contiguous_gradients copies each gradient into an "ipg" bucket buffer
    of reduce_bucket_size elements as backward produces it, two of them with overlap_comm so that one
    fills while the other is reduced (v0.2 deepspeed_zero_optimizer.py and v0.3.13 stage3.py
    backward(): `torch.empty(reduce_bucket_size)`, a second one `if self.overlap_comm`); the whole Ψ
    instead of a bucket without CB, the paper's fused baseline. MD's checkpoint buffer is not an arena:
    DeepSpeed allocates its slots through the allocator (zsim.zero.plan, `md_checkpoints`).
    The ledger grows an arena that turns out too small (gradients waiting on a slow reduction)."""
    if stage < 2:
        return {}
    bucket = bucket_elements if constant_buffers else psi
    return {"grads": (2 if overlap_comm else 1) * param_bytes * bucket}

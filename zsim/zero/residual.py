"""Residual-state sizes (ZeRO §3.2 and §6, ZeRO-R): activation checkpoints under Pa and Pa+cpu,
temporary buffers with and without CB, and MD's pre-allocated arenas. Bytes per GPU; pure functions
that the plan (zsim.zero.plan) and the calculators (zsim memory, zsim maxsize) share.
"""

from __future__ import annotations

import math

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


def optimizer_gradient_bytes(stage: int, partition: int, dtype: str, constant_buffers: bool,
                             bucket_elements: int) -> int:
    """The fp32 copy of this rank's gradients that mixed-precision Adam reads during the step (0 for
    fp32 training, whose gradients are fp32 already).

    Stages 0-2 upcast the whole partition at once: DeepSpeed stage_1_and_2.py step() flattens the
    partition's gradients and converts them to fp32 (its estimator counts these 4Ψ/N bytes: the "4"
    of "18 = 2 + 4 + 4 + 8"). Stage 3 upcasts one sub-group at a time (stage3.py, sub_group_size):
    with CB the sub-group is `bucket_elements`, without it the whole partition.
    """
    if dtype == "fp32":
        return 0
    elements = min(partition, bucket_elements) if stage == 3 and constant_buffers else partition
    return FP32_BYTES * elements


def md_arena_bytes(stage: int, param_bytes: int, psi: int, largest_module: int, bucket_elements: int,
                   constant_buffers: bool, checkpoint_bytes_live: int) -> dict[str, int]:
    """MD's contiguous buffers (ZeRO §6.3), as reserved at the start of the run:
      checkpoints: every checkpoint of one micro-batch that lives on the GPU (DeepSpeed
          checkpointing.py contiguous_memory_optimization: one buffer of num_checkpoints slots);
      grads (stages 2/3): DeepSpeed contiguous_gradients copies each gradient into a contiguous
          buffer as backward produces it: one bucket, closed by the module that crosses the bucket
          size (stage 2; the whole Ψ without CB), or the largest module (stage 3).
    The ledger grows an arena that turns out too small (gradients waiting on a slow reduction)."""
    arenas = {"checkpoints": checkpoint_bytes_live, "grads": 0}
    if stage == 2:
        bucket = min(bucket_elements, psi) if constant_buffers else psi
        arenas["grads"] = param_bytes * min(psi, bucket + largest_module)
    elif stage == 3:
        arenas["grads"] = param_bytes * largest_module
    return {name: size for name, size in arenas.items() if stage >= 2 or name != "grads"}

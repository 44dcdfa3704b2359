"""Measured facts that calibration fits: collectives and compute kernels, with where they came from.

Every importer (runtime traces, Kineto traces, nccl-tests tables, GEMM tables) turns its input into
these records, so that `zsim calibrate` fits any mix of inputs the same way. Times are seconds,
sizes bytes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CollectiveSample:
    """One collective's transfer time, waiting excluded.

    op: all_reduce, all_gather, reduce_scatter, broadcast, reduce or all_to_all.
    nbytes: payload S as nccl-tests counts it (whole buffer; gathered buffer for all_gather and
    reduce_scatter). group: ranks in the process group. seconds: from the last rank's arrival to the
    end (a measured transfer), or nccl-tests' time per call. gpus_per_process: nccl-tests `-g`
    (1 for training jobs: one process per GPU). backend: 'nccl' or 'gloo'. source: file it came from.
    """

    op: str
    nbytes: int
    group: int
    seconds: float
    backend: str
    source: str
    gpus_per_process: int = 1
    dtype: str = "fp32"


@dataclass(frozen=True, slots=True)
class ComputeSample:
    """One compute kernel or phase: its kind, its work, and how long it took.

    kind: `gemm` (one matrix multiply of shape m×n×k) or a trace phase (`fwd`, `bwd`, `recompute`,
    `optimizer`). flops: floating-point operations; nbytes: bytes the kernel streams, where known;
    shape: (m, n, k) for a GEMM. dtype: fp16, bf16 or fp32. seconds: the measured duration.
    """

    kind: str
    flops: float
    seconds: float
    dtype: str
    source: str
    shape: tuple[int, ...] = ()
    nbytes: float = 0.0
    name: str = ""

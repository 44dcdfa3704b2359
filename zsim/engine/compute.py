"""How long a compute op takes on a GPU: matmuls at the achieved tensor-core rate, then the
memory-bound kernels at the achieved HBM bandwidth (a roofline per kernel class, Williams, Waterman &
Patterson 2009; summed, because the two kinds of kernel run one after the other on a stream)."""

from __future__ import annotations

from zsim.config.hardware import Gpu
from zsim.zero.ops import Op


def compute_seconds(op: Op, gpu: Gpu, dtype: str) -> float:
    """Seconds of `op` (flops, hbm_bytes) on `gpu` computing in `dtype`."""
    matmul = op.flops / (gpu.peak_flops[dtype] * gpu.matmul_efficiency) if op.flops else 0.0
    memory = op.hbm_bytes / (gpu.hbm_bytes_per_s * gpu.hbm_efficiency) if op.hbm_bytes else 0.0
    return matmul + memory

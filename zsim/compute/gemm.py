"""How long one (batched) GEMM takes: a tile-and-wave model of a cuBLAS-style kernel.

C[M×N] = A[M×K]·B[K×N], `batch` times. The library splits C into tiles of tm × tn; each SM runs one
tile at a time, so the tiles run in ceil(tiles / SMs) waves (wave quantization: NVIDIA, "Matrix
Multiplication Background User's Guide", 2020, §"Wave quantization"; tile quantization, same guide).
A tile computes 2·tm·tn·(K + k_overhead) FLOPs at the SM's share of peak × efficiency, and streams
(tm + tn)·K operand elements at the SMs' share of the operand bandwidth: small tiles are
bandwidth-bound (the roofline of Williams et al. 2009 applied to a tile's arithmetic intensity
tm·tn/(tm + tn)). When there are too few tiles to fill the GPU, the kernel splits K (split-K, as
cuBLAS and CUTLASS do) and pays for writing and reducing the partial results in fp32. The kernel takes
the fastest tile shape, never less than its HBM roofline (A, B and C moved once), plus a fixed cost.
The terms are fitted to DeepBench's V100 GEMMs (zsim.calibrate.gemm_fit; docs/compute.md).
"""

from __future__ import annotations

import math

from zsim.compute.terms import GemmTerms

_MIN_SPLIT_K = 256  # K elements per split at least (CUTLASS's split-K examples use ≥ 128-element slices)


def gemm_seconds(m: int, n: int, k: int, batch: int, elem_bytes: float, terms: GemmTerms, sms: int,
                 tiles: tuple[tuple[int, int], ...], peak_flops: float, hbm_bytes_per_s: float) -> float:
    """Seconds of `batch` GEMMs of M×N×K with `elem_bytes`-byte operands (see the module docstring)."""
    per_sm_flops = peak_flops / sms * terms.efficiency
    per_sm_bytes = terms.tile_bytes_per_s / sms
    bandwidth = hbm_bytes_per_s * terms.hbm_efficiency
    best = math.inf
    for tm, tn in tiles:
        count = batch * math.ceil(m / tm) * math.ceil(n / tn)
        split = 1
        while True:
            kk = math.ceil(k / split)
            waves = math.ceil(count * split / sms)
            tile = max(2.0 * tm * tn * (kk + terms.k_overhead) / per_sm_flops, (tm + tn) * kk * elem_bytes / per_sm_bytes)
            t = waves * tile
            if split > 1:  # partial sums written and read back in fp32
                t += 2.0 * split * batch * m * n * 4 / bandwidth
            best = min(best, t)
            split *= 2
            if count * split > sms or k / split < _MIN_SPLIT_K:
                break
    roofline = batch * (m * k + k * n + m * n) * elem_bytes / bandwidth
    return terms.fixed_s + max(best, roofline)

"""The price of a kernel list on one GPU: each GEMM by the tile model (zsim.compute.gemm), each
memory-bound kernel at its bytes over the achieved HBM bandwidth plus a fixed per-kernel time, and a
host bound: the framework issues one op every `host_op_s`, so a list of small kernels waits for the
host. The list takes max(GPU time, host time): the two work as a pipeline (the host runs ahead while
the GPU is busy), so the slower one sets the pace (docs/compute.md, "Overheads")."""

from __future__ import annotations

from zsim.compute.gemm import gemm_seconds
from zsim.compute.kernel_list import Kernel, KernelList
from zsim.compute.terms import ComputeTerms


def kernel_seconds(k: Kernel, terms: ComputeTerms, peak_flops: float, hbm_bytes_per_s: float, dtype: str,
                   elem_bytes: float, fp8_flops: float = 0.0, fp4_flops: float = 0.0) -> float:
    """GPU seconds of kernel `k` (all `k.count` launches); a 'host' op (a narrow, a view) has none.
    Tensor-core work (GEMMs, FlashAttention) runs at `peak_flops` × the GPU's sustained_ratio (the tables
    its rates were fitted to are short bursts, a training step runs under the power cap) × its burst_ratio
    (where the terms were carried from another GPU's datasheet; docs/compute.md, "Sustained clocks"). An FP8
    GEMM (`k.fp8`, zsim.compute.fp8) runs at `fp8_flops`, the GPU's FP8 peak, with its 'fp8' GEMM terms and 1-byte operands; an NVFP4 GEMM (`k.fp4`) at `fp4_flops`, the FP4 peak, with its
    'fp4' terms and half-byte operands (their scales, 1/16 byte more, not counted)."""
    if k.kind == "host":
        return 0.0
    if k.fp8:
        assert fp8_flops > 0, "an FP8 GEMM on a GPU without an FP8 peak (the loader refuses precision.fp8 there)"
        peak_flops, dtype, elem_bytes = fp8_flops, "fp8", 1
    elif k.fp4:
        assert fp4_flops > 0, "an NVFP4 GEMM on a GPU without an FP4 peak (the loader refuses precision.fp4 there)"
        peak_flops, dtype, elem_bytes = fp4_flops, "fp4", 0.5
    peak_flops *= terms.tensor_rate
    if k.kind == "flash":  # FlashAttention: its FLOPs at the published rate (zsim.compute.flash)
        return k.count * terms.kernel_s + k.flops / (peak_flops * k.efficiency)
    if k.kind == "gemm":
        g = terms.gemm_terms(dtype)
        return k.count * gemm_seconds(k.m, k.n, k.k, k.batch, elem_bytes, g, terms.sms, terms.tiles, peak_flops,
                                      hbm_bytes_per_s)
    fixed = terms.reduce_kernel_s if k.kind == "reduce" and terms.reduce_kernel_s is not None else terms.kernel_s
    return k.count * fixed + k.rate_bytes / (hbm_bytes_per_s * terms.hbm_efficiency)


def list_seconds(kl: KernelList, terms: ComputeTerms, peak_flops: float, hbm_bytes_per_s: float,
                 dtype: str, fp8_flops: float = 0.0, fp4_flops: float = 0.0) -> float:
    """Seconds the compute stream spends on kernel list `kl`: max(Σ GPU time, host_module_s + launches ×
    host_op_s). The max, not a sum: CUDA-event spans of the H200 runs are at most as long as the larger
    of the two, not their sum (zsim.calibrate.span_timing.combination, docs/calibrate.md)."""
    elem_bytes = 4 if dtype == "fp32" else 2
    gpu = sum(kernel_seconds(k, terms, peak_flops, hbm_bytes_per_s, dtype, elem_bytes, fp8_flops, fp4_flops)
              for k in kl.kernels)
    return max(gpu, terms.host_module_s + kl.launches * terms.host_op_s)


def breakdown(kl: KernelList, terms: ComputeTerms, peak_flops: float, hbm_bytes_per_s: float,
              dtype: str, fp8_flops: float = 0.0, fp4_flops: float = 0.0) -> list[tuple[str, float, float]]:
    """(kernel name, GPU seconds, FLOPs) per kernel of `kl`, for reports and docs."""
    elem_bytes = 4 if dtype == "fp32" else 2
    return [(k.name, kernel_seconds(k, terms, peak_flops, hbm_bytes_per_s, dtype, elem_bytes, fp8_flops, fp4_flops),
             k.flops)
            for k in kl.kernels]

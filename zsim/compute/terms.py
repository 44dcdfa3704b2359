"""The compute model's terms for one GPU kind, in SI units (docs/compute.md lists each with its unit,
meaning and source). Loaded from the `compute:` section of a GPU profile (hwprofiles/gpus/*.yaml),
optionally overridden by a system profile's own `compute:` section (zsim.fabric.cluster)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GemmTerms:
    """The shape-aware GEMM model's fitted terms for one data type (zsim.compute.gemm).

    Attributes:
        efficiency: fraction of the dtype's peak one SM's tensor (or FMA) units sustain inside a tile.
        tile_bytes_per_s: operand bandwidth from L2/shared memory to all SMs together (B/s): a tile of
            tm × tn streams (tm + tn)·K elements, which bounds small tiles.
        k_overhead: per-tile fixed cost (prologue, epilogue, pipeline fill) as extra K elements.
        fixed_s: fixed time of one GEMM call (launch and tail), seconds.
        hbm_efficiency: fraction of HBM bandwidth a memory-bound GEMM reaches (its roofline).
    """

    efficiency: float
    tile_bytes_per_s: float
    k_overhead: float
    fixed_s: float
    hbm_efficiency: float


@dataclass(frozen=True, slots=True)
class ComputeTerms:
    """Everything the compute model needs about one GPU besides its peaks and HBM bandwidth.

    Attributes:
        sms: streaming multiprocessors (tiles run one per SM per wave).
        tiles: GEMM tile shapes (rows, columns) the library chooses among.
        gemm: GemmTerms per dtype ('fp16', 'fp32'; 'bf16' falls back to 'fp16').
        hbm_efficiency: fraction of HBM bandwidth elementwise/reduction kernels reach.
        kernel_s: GPU-side fixed time of one non-GEMM kernel (launch gap and minimum duration), s.
        host_op_s: CPU time the framework spends issuing one op (a kernel cannot start before the
            host has issued it: a stream of small kernels is host-bound), s.
        reduce_kernel_s: GPU-side fixed time of one reduction kernel (sum, max, norm: PyTorch's
            reduce_kernel), s; None: kernel_s.
        sustained_ratio: tensor-core rate a GPU keeps under its power cap for minutes / the rate of the
            short-burst GEMM tables the `gemm` terms were fitted to (fraction, 0-1; 1: none known).
        burst_ratio: tensor-core rate a burst reaches on this GPU / the rate the `gemm` (and attention) terms give
            at its datasheet peak, where those terms were carried from another GPU whose datasheet quotes its peak
            at another clock (fraction, 0-1; 1: the terms are this GPU's own, or no correction is known).
        host_module_s: CPU time the framework spends per module op beyond its launches (Python around
            the kernels: hooks, views, bookkeeping), s; 0 where not fitted (zsim calibrate fits it from
            CUDA-event spans and their host time, zsim.calibrate.span_timing).
    """

    sms: int
    tiles: tuple[tuple[int, int], ...]
    gemm: dict[str, GemmTerms]
    hbm_efficiency: float
    kernel_s: float
    host_op_s: float
    reduce_kernel_s: float | None = None
    sustained_ratio: float = 1.0
    host_module_s: float = 0.0
    burst_ratio: float = 1.0

    @property
    def tensor_rate(self) -> float:
        """The share of its datasheet peak's rate the GPU's tensor-core work runs at in a training step:
        burst_ratio × sustained_ratio (docs/compute.md, "Sustained clocks")."""
        return self.burst_ratio * self.sustained_ratio

    def gemm_terms(self, dtype: str) -> GemmTerms:
        """The GEMM terms for `dtype` (bf16 uses fp16's when it has none of its own)."""
        if dtype in self.gemm:
            return self.gemm[dtype]
        if dtype == "bf16" and "fp16" in self.gemm:
            return self.gemm["fp16"]
        raise KeyError(dtype)

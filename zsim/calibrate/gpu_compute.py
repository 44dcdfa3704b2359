"""`zsim calibrate` of a GPU profile's compute terms from GEMM tables, through issue 9's GEMM model
(docs/compute.md: `zsim/compute/gemm.py`, fitted by `zsim/calibrate/gemm_fit.py`). The five
`gemm.<dtype>` terms are written into the system profile's `compute:` section, which replaces the
GPU's own (issue 9's ComputeOverride). Until issue 9 is merged, this module refuses with that reason.

Phase timings (`fwd/layer` spans of runtime or simulated traces) are sums of many kernels: they fit the
memory-bound terms with the kernel lists as the design matrix (zsim.calibrate.gpu_phase_fit), not these.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from zsim.calibrate.collectives import CalibrationError
from zsim.trace.samples import ComputeSample

# A GEMM fit whose terms end here has not found them in the data (gemm_fit.PARAMS bounds that are
# not physical limits: an efficiency of 1 is, an operand bandwidth of 50 TB/s is not).
_ARTIFICIAL = {"efficiency": ("lo",), "tile_TBps": ("lo", "hi"), "k_overhead": ("hi",), "fixed_us": ("hi",),
               "hbm_efficiency": ("lo",)}


def calibrate_gemms(cluster: Any, samples: list[ComputeSample]) -> tuple[dict[str, Any], dict[str, Any]]:
    """({dtype: gemm terms in profile units}, {dtype: fit summary}) from GEMM samples.

    A dtype whose fitted terms end on artificial bounds lists them in its summary's `at_bounds`.

    Raises:
        CalibrationError: issue 9's model absent, a dtype the GPU has no peak for, too few shapes.
    """
    phases = sorted({s.kind for s in samples if s.kind != "gemm"})
    assert not phases, "calibrate_gemms takes GEMM samples only"  # phases go to gpu_phase_fit
    try:
        from zsim.calibrate.gemm_fit import PARAMS, GemmHardware, GemmRow, fit
    except ImportError:
        raise CalibrationError("GEMM tables need the kernel-level compute model of issue 9 (zsim.compute, "
                               "zsim.calibrate.gemm_fit), which this build does not have; --fit collectives "
                               "fits the rest") from None
    terms = getattr(cluster.gpu, "compute", None)
    if terms is None:
        raise CalibrationError(f"GPU {cluster.gpu.name} has no compute section to fit")
    by_dtype: dict[str, list[ComputeSample]] = defaultdict(list)
    for s in samples:
        by_dtype[s.dtype].append(s)
    values, summary = {}, {}
    bounds = {p[0]: (p[2], p[3]) for p in PARAMS}
    for dtype, rows in sorted(by_dtype.items()):
        if dtype not in cluster.gpu.peak_flops:
            raise CalibrationError(f"GEMMs in {dtype}, but {cluster.gpu.name} has no {dtype} peak")
        hw = GemmHardware(sms=terms.sms, tiles=terms.tiles, peak_flops=cluster.gpu.peak_flops[dtype],
                          hbm_bytes_per_s=cluster.gpu.hbm_bytes_per_s, elem_bytes=4 if dtype in ("fp32", "tf32") else 2)
        shapes = len({s.shape for s in rows})  # repeated timings of one shape add no information
        if shapes < 2 * len(PARAMS):
            raise CalibrationError(f"{shapes} distinct {dtype} GEMM shapes ({len(rows)} samples); fitting the "
                                   f"{len(PARAMS)} GEMM terms needs at least {2 * len(PARAMS)} (or --fit collectives)")
        result = fit([GemmRow(s.shape[0], s.shape[1], s.shape[2], s.shape[3] if len(s.shape) > 3 else 1, s.seconds)
                      for s in rows], hw)  # shape (m, n, k[, batch]): XLA tables carry the batch
        stuck = [f"{k} = {v:.4g}" for k, v in result.values.items() for side in _ARTIFICIAL.get(k, ())
                 if abs(v - bounds[k][0 if side == "lo" else 1]) <= 1e-6 * max(1.0, abs(bounds[k][1]))]
        values[dtype] = {k: round(v, 4) for k, v in result.values.items()}
        summary[dtype] = {k: round(float(v), 4) for k, v in result.summary().items()}
        if stuck:  # the GEMM model does not fit these shapes: a cause of a poor fit (zsim.calibrate.fit_quality)
            summary[dtype]["at_bounds"] = stuck
    return values, summary


def gemm_reference(cluster: Any, dtype: str) -> dict[str, float]:
    """The base GPU's GEMM terms of `dtype` in profile units (what a fit is compared with), {} if none."""
    g = cluster.gpu.compute.gemm.get(dtype) if getattr(cluster.gpu, "compute", None) else None
    if g is None:
        return {}
    return {"efficiency": g.efficiency, "tile_TBps": g.tile_bytes_per_s / 1e12, "k_overhead": g.k_overhead,
            "fixed_us": g.fixed_s * 1e6, "hbm_efficiency": g.hbm_efficiency}


def with_gemm_terms(cluster: Any, gemm: dict[str, dict[str, float]]) -> Any:
    """`cluster` with its GPU's GEMM terms replaced by `gemm` ({dtype: terms in profile units}, as
    calibrate_gemms returns them), so that a phase fit prices GEMMs as the written profile will."""
    import dataclasses

    from zsim.compute.terms import GemmTerms

    terms = cluster.gpu.compute
    new = dict(terms.gemm)
    for dtype, g in gemm.items():
        new[dtype] = GemmTerms(efficiency=g["efficiency"], tile_bytes_per_s=g["tile_TBps"] * 1e12,
                               k_overhead=g["k_overhead"], fixed_s=g["fixed_us"] * 1e-6,
                               hbm_efficiency=g["hbm_efficiency"])
    gpu = dataclasses.replace(cluster.gpu, compute=dataclasses.replace(terms, gemm=new))
    return dataclasses.replace(cluster, gpu=gpu)

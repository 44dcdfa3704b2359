"""`zsim calibrate` of a GPU's memory-bound compute terms from phase timings: every compute op of a
runtime (or simulated) trace, lined up with the simulator's plan op of the same name, step,
micro-batch and occurrence, whose kernel list (zsim.compute.kernels) is the design matrix.

Per op (docs/compute.md, "The compute model"):

    t = Σ GEMM (the profile's GEMM terms, kept) + kernel_s · n_mem + reduce_kernel_s · n_reduce
        + bytes / (HBM · hbm_efficiency)

is linear in the three memory-bound terms (kernel_s, reduce_kernel_s, x = 1/(HBM·η)); they are
fitted by linear least squares (numpy.linalg.lstsq) on the time each op leaves after its GEMMs,
weighted by 1/t (each op's relative error counts alike; layers of 10 ms and an embedding of 0.5 ms
both matter). An op without a kernel list contributes its FLOPs at the GEMM model's large-tile rate
and its bytes to x. The GEMM terms come from GEMM tables (`gemm.<dtype>`, zsim.calibrate.gemm_fit):
a phase is a sum of many kernels and cannot separate GEMM efficiency from the rest.

Ops whose measured time the host, not the GPU, sets (launches × host_op_s of the base within 0.1% of
the measured time or above it: the framework issuing small kernels) say nothing about the GPU and are left out,
counted. A term the data cannot determine (no op with reductions, or a design matrix of rank below
the terms) is kept from the base and listed as kept; a fit with a term ≤ 0 or η > 1 is refused.

A runtime run recorded with Kineto traces on a GPU (`rank<R>.kineto.json` with kernels) is timed by
its GPU kernels instead of its host spans (zsim.calibrate.kineto_compute); nothing is then host-bound.

Held out: with two or more runs, each run is predicted by a fit of the others; with one, even steps
predict odd ones and back (2-fold).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zsim.calibrate.collectives import CalibrationError
from zsim.compute.gemm import gemm_seconds
from zsim.compute.terms import ComputeTerms

TERMS = ("kernel_us", "reduce_kernel_us", "hbm_efficiency")


@dataclass(frozen=True, slots=True)
class PhaseRow:
    """One measured compute op as the fit sees it: known seconds (GEMMs, FLOPs of list-less ops), the
    memory-bound kernel counts and bytes, the measured seconds, and where it came from."""

    known_s: float
    n_mem: int
    n_reduce: int
    bytes: float
    seconds: float
    launches: int
    group: str  # the held-out fold: run index, or step parity with one run


@dataclass(slots=True)
class PhaseFit:
    values: dict[str, float]  # profile units: kernel_us, reduce_kernel_us, hbm_efficiency
    kept: list[str]
    ops: int
    host_bound: int
    median_error: float
    max_error: float
    heldout_median: float | None
    heldout_max: float | None
    folds: str
    residuals: list[float] = field(default_factory=list)
    timing: str = "host spans"  # what measured each op: host spans, or its GPU kernels (Kineto)

    def summary(self) -> dict[str, Any]:
        return {"ops": self.ops, "timing": self.timing, "host_bound_ops_left_out": self.host_bound, "kept_from_base": self.kept,
                "median_error": round(self.median_error, 4), "max_error": round(self.max_error, 4),
                "heldout": {"folds": self.folds,
                            "median_error": None if self.heldout_median is None else round(self.heldout_median, 4),
                            "max_error": None if self.heldout_max is None else round(self.heldout_max, 4)}}


def op_row(op: Any, seconds: float, terms: ComputeTerms, peak_flops: float, hbm_bytes_per_s: float, dtype: str,
           group: str) -> PhaseRow:
    """Split a plan op into what the fit keeps (GEMM seconds) and what it fits (counts, bytes)."""
    elem = 4 if dtype == "fp32" else 2
    g = terms.gemm_terms(dtype)
    if op.kernels is None:
        known = op.flops / (peak_flops * g.efficiency) if op.flops else 0.0
        return PhaseRow(known, 0, 0, float(op.hbm_bytes or 0.0), seconds, 1, group)
    known, n_mem, n_red, nbytes = 0.0, 0, 0, 0.0
    for k in op.kernels.kernels:
        if k.kind == "gemm":
            known += k.count * gemm_seconds(k.m, k.n, k.k, k.batch, elem, g, terms.sms, terms.tiles, peak_flops,
                                            hbm_bytes_per_s)
        elif k.kind == "reduce":
            n_red += k.count
            nbytes += k.bytes
        else:
            n_mem += k.count
            nbytes += k.bytes
    return PhaseRow(known, n_mem, n_red, nbytes, seconds, op.kernels.launches, group)


def _solve(rows: list[PhaseRow], free: list[int], base: np.ndarray) -> np.ndarray:
    """Least squares (weights 1/t) of the `free` columns of [n_mem, n_reduce, bytes]; the others at `base`."""
    a = np.array([[r.n_mem, r.n_reduce, r.bytes] for r in rows], dtype=float)
    rest = np.array([r.seconds - r.known_s for r in rows]) - a @ np.where(np.isin(np.arange(3), free), 0.0, base)
    w = 1.0 / np.array([r.seconds for r in rows])
    sol, *_ = np.linalg.lstsq(a[:, free] * w[:, None], rest * w, rcond=None)
    out = base.copy()
    out[free] = sol
    return out


def _predict(rows: list[PhaseRow], p: np.ndarray) -> np.ndarray:
    return np.array([r.known_s + r.n_mem * p[0] + r.n_reduce * p[1] + r.bytes * p[2] for r in rows])


def fit(rows: list[PhaseRow], terms: ComputeTerms, hbm_bytes_per_s: float, folds: str,
        host_paced: bool = True) -> PhaseFit:
    """Fit the memory-bound terms to `rows`. `host_paced`: the rows are host spans, which the host's
    launch pace bounds below (the host-bound ones are left out); GPU kernel times (Kineto) are not.

    Raises:
        CalibrationError: too few GPU-bound ops or distinct shapes for the terms, or fitted terms that
        are not physical (a fixed time ≤ 0, η outside (0, 1]).
    """
    # within 0.1% of the host's pace counts as host-bound (trace times are rounded to 1 ns-1 us)
    gpu_bound = [r for r in rows if not host_paced or r.launches * terms.host_op_s < r.seconds * (1.0 - 1e-3)]
    host_bound = len(rows) - len(gpu_bound)
    base = np.array([terms.kernel_s, terms.reduce_kernel_s if terms.reduce_kernel_s is not None else terms.kernel_s,
                     1.0 / (hbm_bytes_per_s * terms.hbm_efficiency)])
    a = np.array([[r.n_mem, r.n_reduce, r.bytes] for r in gpu_bound], dtype=float).reshape(-1, 3)
    free = [i for i in range(3) if a.size and np.any(a[:, i] > 0)]
    distinct = {(r.n_mem, r.n_reduce, round(r.bytes)) for r in gpu_bound}
    if len(distinct) < 2 * max(1, len(free)) or np.linalg.matrix_rank(a[:, free]) < len(free):
        raise CalibrationError(f"{len(distinct)} distinct GPU-bound compute ops ({host_bound} host-bound left out) "
                               f"cannot determine {len(free) or 'the'} memory-bound compute terms: give runs of more "
                               "shapes, or --fit collectives")
    p = _solve(gpu_bound, free, base)
    bad = [f"{TERMS[i]} = {p[i] * 1e6:.3g} us" for i in free if i < 2 and p[i] <= 0]
    if 2 in free and (p[2] <= 0 or 1.0 / (p[2] * hbm_bytes_per_s) > 1.0):
        bad.append(f"hbm_efficiency = {1.0 / (p[2] * hbm_bytes_per_s) if p[2] > 0 else float('inf'):.3g}")
    if bad:
        raise CalibrationError(f"the compute model does not fit these phase timings ({', '.join(bad)})")
    measured = np.array([r.seconds for r in gpu_bound])
    errors = np.abs(_predict(gpu_bound, p) / measured - 1.0)
    held = []
    groups = sorted({r.group for r in gpu_bound})
    if len(groups) >= 2:
        for g in groups:
            train = [r for r in gpu_bound if r.group != g]
            test = [r for r in gpu_bound if r.group == g]
            try:
                q = _solve(train, free, base)
            except np.linalg.LinAlgError:
                continue
            held += list(np.abs(_predict(test, q) / np.array([r.seconds for r in test]) - 1.0))
    values = {"kernel_us": float(p[0] * 1e6), "reduce_kernel_us": float(p[1] * 1e6),
              "hbm_efficiency": float(1.0 / (p[2] * hbm_bytes_per_s))}
    return PhaseFit(values, [TERMS[i] for i in range(3) if i not in free], len(gpu_bound), host_bound,
                    float(np.median(errors)), float(np.max(errors)),
                    float(np.median(held)) if held else None, float(np.max(held)) if held else None, folds,
                    list(errors))


def calibrate_phases(cluster: Any, runs: list[Any], profile: str, profiles: Any = None) -> PhaseFit:
    """Fit the memory-bound compute terms of `cluster`'s GPU from the compute ops of `runs` (runtime
    trace folders or simulated traces), lined up with plans rebuilt on `profile`.

    Raises:
        ConfigError: a run cannot be rebuilt on the profile.
        CalibrationError: ops that do not line up, runs of different precisions, or data that cannot
        determine the terms (fit).
    """
    from zsim.calibrate.host_calibration import aligned_ops
    from zsim.calibrate.kineto_compute import gpu_aligned_ops

    terms = cluster.gpu.compute
    if terms is None:
        raise CalibrationError(f"GPU {cluster.gpu.name} has no compute section to fit")
    dtypes = {str(run.metadata.get("precision", "fp16")) for run in runs}
    if len(dtypes) > 1:
        raise CalibrationError(f"runs of different precisions ({', '.join(sorted(dtypes))}): calibrate each separately")
    dtype = dtypes.pop()
    if dtype not in cluster.gpu.peak_flops:
        raise CalibrationError(f"runs in {dtype}, but {cluster.gpu.name} has no {dtype} peak")
    peak, hbm = cluster.gpu.peak_flops[dtype], cluster.gpu.hbm_bytes_per_s
    timed = {id(run): _gpu_timed(run) for run in runs}
    if len({t is not None for t in timed.values()}) > 1:
        raise CalibrationError("some runs have Kineto traces with GPU kernels and some do not: GPU kernel times and "
                               "host spans are different measures; calibrate each kind separately")
    rows = []
    for i, run in enumerate(runs):
        traces = timed[id(run)]
        pairs = gpu_aligned_ops(run, traces, profile, profiles) if traces else aligned_ops(run, profile, profiles)
        for op, seconds in pairs:
            group = f"run {i}" if len(runs) > 1 else f"step parity {op.step % 2}"
            rows.append(op_row(op, seconds, terms, peak, hbm, dtype, group))
    folds = "one run per fold" if len(runs) > 1 else "even and odd steps"
    on_gpu = any(t is not None for t in timed.values())
    result = fit(rows, terms, hbm, folds, host_paced=not on_gpu)
    result.timing = "GPU kernels (Kineto)" if on_gpu else "host spans"
    return result


def _gpu_timed(run: Any) -> Any:
    """The labelled Kineto traces of a runtime run when they time compute on a GPU, else None (no
    Kineto files, a CPU run's, or a simulated trace)."""
    from zsim.calibrate.kineto_compute import has_gpu_compute, read_labelled

    if run.metadata.get("source") == "simulated":
        return None
    traces = read_labelled(run.folder)
    return traces if traces and has_gpu_compute(traces) else None

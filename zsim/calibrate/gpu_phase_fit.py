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
the terms) is kept from the base and listed as kept. The terms are bounded to what is physical (fixed
times ≥ 0, η ≤ 1); a term the data push onto its bound is a cause of a poor fit (refused unless
--accept-poor-fit, zsim.calibrate.fit_quality), named with its value.

A runtime run timed by CUDA events on a GPU (`timing: cuda_event`, with `host_us` apart) is split by
zsim.calibrate.span_timing: a span lasts max(device work, host time), so the device terms are fitted
on the device-bound spans alone, and the host terms (`host_op_us` per launch, `host_module_us` per
op) on the host-bound spans, apart. Its held-out error is that of the whole model, max(device, host),
on every op of the held-out run, idle time before each op included.

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
from zsim.calibrate.span_timing import (DEVICE_BOUND, SpanSample, combination, fit_host, host_seconds, is_span_timed,
                                        span_samples)
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
    at_bounds: list[str] = field(default_factory=list)  # 'term = value' left on a physical bound
    host: dict[str, float] = field(default_factory=dict)  # host terms fitted apart (CUDA-event spans)
    spans: dict[str, Any] = field(default_factory=dict)  # what the CUDA-event spans showed (span_timing)

    def summary(self) -> dict[str, Any]:
        return {"ops": self.ops, "timing": self.timing, "host_bound_ops_left_out": self.host_bound, "kept_from_base": self.kept,
                "median_error": round(self.median_error, 4), "max_error": round(self.max_error, 4),
                "heldout": {"folds": self.folds,
                            "median_error": None if self.heldout_median is None else round(self.heldout_median, 4),
                            "max_error": None if self.heldout_max is None else round(self.heldout_max, 4)},
                **({"at_bounds": self.at_bounds} if self.at_bounds else {}),
                **({"host": {k: round(v, 4) for k, v in self.host.items()}} if self.host else {}),
                **({"spans": self.spans} if self.spans else {})}


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
            nbytes += k.rate_bytes
    return PhaseRow(known, n_mem, n_red, nbytes, seconds, op.kernels.launches, group)


def _solve(rows: list[PhaseRow], free: list[int], base: np.ndarray, hbm_bytes_per_s: float) -> np.ndarray:
    """Least squares (weights 1/t) of the `free` columns of [n_mem, n_reduce, bytes]; the others at `base`.
    Bounded to what is physical (scipy's lsq_linear): fixed times ≥ 0, η ≤ 1 (x ≥ 1/HBM); a term on
    its bound is what `at_bounds` reports."""
    from scipy.optimize import lsq_linear

    a = np.array([[r.n_mem, r.n_reduce, r.bytes] for r in rows], dtype=float)
    rest = np.array([r.seconds - r.known_s for r in rows]) - a @ np.where(np.isin(np.arange(3), free), 0.0, base)
    w = 1.0 / np.array([r.seconds for r in rows])
    lo = np.array([0.0, 0.0, 1.0 / hbm_bytes_per_s])[free]
    scale = np.array([1e-6, 1e-6, 1.0 / hbm_bytes_per_s])[free]  # columns in µs and 1/HBM: a well-posed problem
    sol = lsq_linear(a[:, free] * scale * w[:, None], rest * w, bounds=(lo / scale, np.inf)).x * scale
    out = base.copy()
    out[free] = sol
    return out


def _at_bounds(p: np.ndarray, free: list[int], hbm_bytes_per_s: float) -> list[str]:
    """'term = value' for each free term the bounded fit left on its bound (0 µs, or η = 1)."""
    out = [f"{TERMS[i]} = 0 us" for i in free if i < 2 and p[i] <= 1e-12]
    if 2 in free and p[2] * hbm_bytes_per_s <= 1.0 + 1e-9:
        out.append("hbm_efficiency = 1")
    return out


def _predict(rows: list[PhaseRow], p: np.ndarray) -> np.ndarray:
    return np.array([r.known_s + r.n_mem * p[0] + r.n_reduce * p[1] + r.bytes * p[2] for r in rows])


def fit(rows: list[PhaseRow], terms: ComputeTerms, hbm_bytes_per_s: float, folds: str,
        host_paced: bool = True) -> PhaseFit:
    """Fit the memory-bound terms to `rows`. `host_paced`: the rows are host spans, which the host's
    launch pace bounds below (the host-bound ones are left out); GPU kernel times (Kineto) are not.

    The terms are bounded to what is physical (fixed times ≥ 0, η ≤ 1); terms the data push onto a
    bound are listed in the result's `at_bounds` (a cause of a poor fit, zsim.calibrate.fit_quality).

    Raises:
        CalibrationError: too few GPU-bound ops or distinct shapes for the terms.
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
    p = _solve(gpu_bound, free, base, hbm_bytes_per_s)
    measured = np.array([r.seconds for r in gpu_bound])
    errors = np.abs(_predict(gpu_bound, p) / measured - 1.0)
    held = []
    groups = sorted({r.group for r in gpu_bound})
    if len(groups) >= 2:
        for g in groups:
            train = [r for r in gpu_bound if r.group != g]
            test = [r for r in gpu_bound if r.group == g]
            try:
                q = _solve(train, free, base, hbm_bytes_per_s)
            except (np.linalg.LinAlgError, ValueError):
                continue
            held += list(np.abs(_predict(test, q) / np.array([r.seconds for r in test]) - 1.0))
    values = {"kernel_us": float(p[0] * 1e6), "reduce_kernel_us": float(p[1] * 1e6),
              "hbm_efficiency": float(1.0 / (p[2] * hbm_bytes_per_s))}
    return PhaseFit(values, [TERMS[i] for i in range(3) if i not in free], len(gpu_bound), host_bound,
                    float(np.median(errors)), float(np.max(errors)),
                    float(np.median(held)) if held else None, float(np.max(held)) if held else None, folds,
                    list(errors), at_bounds=_at_bounds(p, free, hbm_bytes_per_s))


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
    on_gpu = any(t is not None for t in timed.values())
    if not on_gpu and runs and all(is_span_timed(run) for run in runs):
        return _calibrate_spans(runs, terms, peak, hbm, dtype, profile, profiles)
    rows = []
    for i, run in enumerate(runs):
        traces = timed[id(run)]
        pairs = gpu_aligned_ops(run, traces, profile, profiles) if traces else aligned_ops(run, profile, profiles)
        for op, seconds in pairs:
            group = f"run {i}" if len(runs) > 1 else f"step parity {op.step % 2}"
            rows.append(op_row(op, seconds, terms, peak, hbm, dtype, group))
    folds = "one run per fold" if len(runs) > 1 else "even and odd steps"
    result = fit(rows, terms, hbm, folds, host_paced=not on_gpu)
    result.timing = "GPU kernels (Kineto)" if on_gpu else "host spans"
    return result


def _calibrate_spans(runs: list[Any], terms: ComputeTerms, peak: float, hbm: float, dtype: str, profile: str,
                     profiles: Any) -> PhaseFit:
    """The device terms from the device-bound CUDA-event spans, the host terms from the host-bound ones
    (zsim.calibrate.span_timing); errors of the whole model, max(device, host), on every op.

    Raises:
        CalibrationError: spans that show host and device time adding up (the simulator's host bound is a
        max), too few device-bound ops or host-bound spans for their terms.
    """
    by_run = [span_samples(run, profile, profiles) for run in runs]
    every = [pair for pairs in by_run for pair in pairs]
    shown = combination(every, peak)
    if shown["combination"] != "max":
        raise CalibrationError(f"of {shown['spans']} CUDA-event spans, {shown['unexplained_by_max']} are shorter than "
                               f"max(host time, FLOPs at peak) and only {shown['unexplained_by_sum']} shorter than "
                               "their sum: host and device time add up here, and the simulator's host bound is "
                               "their max, which cannot price them")
    group = (lambda i, op: f"run {i}") if len(runs) > 1 else (lambda i, op: f"step parity {op.step % 2}")
    device = [op_row(op, s.device_s, terms, peak, hbm, dtype, group(i, op))
              for i, pairs in enumerate(by_run) for op, s in pairs if s.device_bound]
    result = fit(device, terms, hbm, "one run per fold" if len(runs) > 1 else "even and odd steps", host_paced=False)
    host, used = fit_host(every)
    if not host:
        raise CalibrationError(f"{used} host-bound CUDA-event spans of ops with kernel lists cannot determine the "
                               "host terms (host_module_us, host_op_us): give runs of more shapes")
    result.host, result.timing = host, "CUDA-event spans, host time apart"
    # a host term the non-negative fit left at 0 (within _at_bounds' 1e-12 s) is on its bound, as a device term is
    result.at_bounds = result.at_bounds + [f"{name} = 0 us" for name, value in host.items() if value <= 1e-6]
    result.host_bound = used
    errors = np.abs(span_errors(every, result.values, host, terms, peak, hbm, dtype))
    result.median_error, result.max_error, result.residuals = float(np.median(errors)), float(np.max(errors)), list(errors)
    held: list[float] = []
    folded = [(group(i, op), (op, s)) for i, pairs in enumerate(by_run) for op, s in pairs]
    for fold in sorted({g for g, _ in folded}):  # each run (or step parity) predicted by a fit of the others
        train = [pair for g, pair in folded if g != fold]
        try:
            q = fit([r for r in device if r.group != fold], terms, hbm, "", host_paced=False)
        except CalibrationError:
            continue
        h, _ = fit_host(train)
        if h:
            held += list(np.abs(span_errors([pair for g, pair in folded if g == fold], q.values, h, terms, peak, hbm,
                                            dtype)))
    result.heldout_median = float(np.median(held)) if held else None
    result.heldout_max = float(np.max(held)) if held else None
    result.spans = {**shown, "device_bound": len(device), "host_bound": used, "device_bound_factor": DEVICE_BOUND,
                    "host_median_error": round(host_error(every, host), 4),
                    "worst_ops": worst_ops(every, span_errors(every, result.values, host, terms, peak, hbm, dtype))}
    return result


def host_error(pairs: list[tuple[Any, SpanSample]], host: dict[str, float]) -> float:
    """Median relative error of the host terms on the host-bound spans of ops with kernel lists."""
    used = [(op, s) for op, s in pairs if not s.device_bound and op.kernels is not None]
    return float(np.median([abs(host_seconds(op, host) / s.host_s - 1.0) for op, s in used])) if used else 0.0


def worst_ops(pairs: list[tuple[Any, SpanSample]], errors: np.ndarray, count: int = 3) -> list[str]:
    """The `count` op kinds (layer index dropped) the model misses most, by median signed error, each
    with what set its measured time (the GPU or the host) in most of its spans."""
    import re

    kinds: dict[str, list[tuple[float, bool]]] = {}
    for (op, s), e in zip(pairs, errors):
        kinds.setdefault(re.sub(r"\.\d+$", "", op.name), []).append((float(e), s.device_bound))
    ranked = sorted(kinds.items(), key=lambda kv: -abs(np.median([e for e, _ in kv[1]])))[:count]
    return [f"{kind} {np.median([e for e, _ in v]):+.0%} "
            f"({'device' if 2 * sum(b for _, b in v) > len(v) else 'host'}-bound, {len(v)} spans)" for kind, v in ranked]


def span_predictions(pairs: list[tuple[Any, SpanSample]], device: dict[str, float], host: dict[str, float],
                     terms: ComputeTerms, peak: float, hbm: float, dtype: str) -> np.ndarray:
    """Seconds the fitted model gives each op of `pairs`: max(device work under the `device` terms
    (profile units), host time under the `host` terms); an op without a kernel list, its device time."""
    p = np.array([device["kernel_us"] * 1e-6, device["reduce_kernel_us"] * 1e-6, 1.0 / (hbm * device["hbm_efficiency"])])
    rows = [op_row(op, s.device_s, terms, peak, hbm, dtype, "") for op, s in pairs]
    dev = _predict(rows, p)
    return np.array([max(d, host_seconds(op, host)) for d, (op, _) in zip(dev, pairs)])


def span_errors(pairs: list[tuple[Any, SpanSample]], device: dict[str, float], host: dict[str, float],
                terms: ComputeTerms, peak: float, hbm: float, dtype: str) -> np.ndarray:
    """Relative error of span_predictions against each op's span plus the idle time before it."""
    measured = np.array([s.measured_s for _, s in pairs])
    return span_predictions(pairs, device, host, terms, peak, hbm, dtype) / measured - 1.0


def _gpu_timed(run: Any) -> Any:
    """The labelled Kineto traces of a runtime run when they time compute on a GPU, else None (no
    Kineto files, a CPU run's, or a simulated trace)."""
    from zsim.calibrate.kineto_compute import has_gpu_compute, read_labelled

    if run.metadata.get("source") == "simulated":
        return None
    traces = read_labelled(run.folder)
    return traces if traces and has_gpu_compute(traces) else None


def heldout_run(cluster: Any, train: list[Any], test: Any, profile: str, profiles: Any = None) -> dict[str, Any]:
    """The phase fit of CUDA-event-timed runs `train` judged on run `test`, which it never saw: the fit's
    summary, and over every compute op of `test` (idle time before each included) the median and
    largest |relative error| of max(device, host), and the error of their sum (a step's compute).

    Raises:
        CalibrationError: as calibrate_phases; runs not timed by CUDA events with host time.
    """
    if not all(is_span_timed(run) for run in [*train, test]):
        raise CalibrationError("heldout_run needs runtime runs timed by CUDA events with host_us (a GPU's)")
    pf = calibrate_phases(cluster, train, profile, profiles)
    dtype = str(test.metadata.get("precision", "fp16"))
    terms, peak, hbm = cluster.gpu.compute, cluster.gpu.peak_flops[dtype], cluster.gpu.hbm_bytes_per_s
    pairs = span_samples(test, profile, profiles)
    predicted = span_predictions(pairs, pf.values, pf.host, terms, peak, hbm, dtype)
    measured = np.array([s.measured_s for _, s in pairs])
    errors = predicted / measured - 1.0
    return {"fit": {**pf.values, **pf.host}, "summary": pf.summary(), "ops": len(pairs),
            "median_error": float(np.median(np.abs(errors))), "max_error": float(np.max(np.abs(errors))),
            "total_error": float(predicted.sum() / measured.sum() - 1.0),
            "worst_ops": worst_ops(pairs, errors)}


def kineto_heldout(cluster: Any, train: list[Any], test: Any, profile: str, profiles: Any = None) -> dict[str, Any]:
    """The phase fit of runs timed by their GPU kernels (Kineto) `train`, judged on run `test`'s kernels, which
    it never saw: the fit's summary and, over every compute op of `test`, the median and largest |relative
    error|, the error of their sum, and the ops it misses most.

    Raises:
        CalibrationError: as calibrate_phases; a run without Kineto GPU kernels.
    """
    from zsim.calibrate.kineto_compute import gpu_aligned_ops

    traces = _gpu_timed(test)
    if traces is None or any(_gpu_timed(run) is None for run in train):
        raise CalibrationError("kineto_heldout needs runtime runs with Kineto traces of GPU kernels")
    pf = calibrate_phases(cluster, train, profile, profiles)
    dtype = str(test.metadata.get("precision", "fp16"))
    terms, peak, hbm = cluster.gpu.compute, cluster.gpu.peak_flops[dtype], cluster.gpu.hbm_bytes_per_s
    pairs = gpu_aligned_ops(test, traces, profile, profiles)
    p = np.array([pf.values["kernel_us"] * 1e-6, pf.values["reduce_kernel_us"] * 1e-6,
                  1.0 / (hbm * pf.values["hbm_efficiency"])])
    predicted = _predict([op_row(op, s, terms, peak, hbm, dtype, "") for op, s in pairs], p)
    measured = np.array([s for _, s in pairs])
    errors = predicted / measured - 1.0
    spans = [(op, SpanSample(s, 0.0, 0.0)) for op, s in pairs]  # kernel time: every op device-bound
    return {"fit": pf.values, "summary": pf.summary(), "ops": len(pairs),
            "median_error": float(np.median(np.abs(errors))), "max_error": float(np.max(np.abs(errors))),
            "total_error": float(predicted.sum() / measured.sum() - 1.0),
            "worst_ops": worst_ops(spans, errors)}

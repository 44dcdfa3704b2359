"""Calibrating a host (CPU) profile from the runtime's own traces: the gloo collectives' latency and
bandwidth per collective and group size, and the compute terms (matmul rate, streaming bandwidth,
per-op overhead) that zsim.config.host defines and the simulator uses for a CPU run.

Both are linear in their unknowns once times are divided by nothing but the terms, so both are
fitted by bounded linear least squares (scipy.optimize.lsq_linear):

* collective: t = α + S·(1/β) per (op, group size), on the median time of each distinct size, on
  relative residuals (each size divided by its time: sizes span orders of magnitude);
  α ≥ 0 (physical), 1/β > 0. One distinct size cannot separate α from β: the base profile's α is
  kept and β fitted, and if the base has no such entry, calibration refuses.
* compute: t = n·o + F·(1/T) + B·(1/M) over every compute op (relative least squares: see
  fit_compute), with n the kernels of its kernel list, F its FLOPs and B its streamed
  bytes as the simulator's plan counts them (the measured op is lined up with the plan's op of the
  same name, step, micro-batch and occurrence), so the fit prices exactly what the simulator will.

Relative least squares is biased low on noisy times: a sample that noise made long weighs less
(1/t) than one noise made short, so the fitted line follows the short ones. On this machine's
calibration runs the compute fit's ops summed to 86-93% of the measured time. The simulator's answer
is a sum of op times (a step), so both compute fits end by scaling their fitted terms by one factor,
Σ measured / Σ fitted over the fitted ops (`match_total`): the relative fit sets the shape across op
sizes, the factor the level. Noiseless times (a simulated trace) give a factor of 1.

Refusals (CalibrationError): fewer distinct samples than twice the terms, a rate whose inverse hits 0
(time does not grow with the work: the term is not determined), no samples of a kind at all.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from zsim.calibrate.optimizer import scipy_optimize
from zsim.calibrate.collectives import SAMPLES_PER_TERM, CalibrationError
from zsim.trace.samples import CollectiveSample


@dataclass(frozen=True, slots=True)
class LineFit:
    """Intercept (s), slopes (s per unit of each x), per-row relative errors, and what was kept."""

    intercept: float
    slopes: tuple[float, ...]
    errors: tuple[float, ...]
    intercept_kept: bool = False

    @property
    def median_error(self) -> float:
        return float(np.median(np.abs(self.errors))) if self.errors else 0.0

    @property
    def max_error(self) -> float:
        return float(np.max(np.abs(self.errors))) if self.errors else 0.0


def relative_line(xs: np.ndarray, ts: np.ndarray, intercept: float | None = None, relative: bool = True) -> LineFit:
    """t ≈ a + xs·b with a, b ≥ 0, minimising Σ((prediction − t)/t)² (or Σ(prediction − t)² when not
    `relative`); `intercept` fixes a."""
    xs = np.atleast_2d(xs.T).T if xs.ndim == 1 else xs
    w = 1.0 / ts if relative else np.full(len(ts), 1.0 / float(np.mean(ts)))
    if intercept is None:
        design = np.column_stack([np.ones(len(ts)), xs]) * w[:, None]
        target = ts * w
    else:
        design = xs * w[:, None]
        target = (ts - intercept) * w
    scale = np.maximum(np.abs(design).max(axis=0), 1e-300)
    optimize = scipy_optimize("the host fit (zsim calibrate)")
    solution = optimize.lsq_linear(design / scale, target, bounds=(0.0, np.inf), lsmr_tol="auto", method="bvls")
    coef = solution.x / scale
    a, b = (coef[0], coef[1:]) if intercept is None else (intercept, coef)
    predicted = a + xs @ b
    return LineFit(float(a), tuple(float(v) for v in b), tuple(float(v) for v in predicted / ts - 1.0),
                   intercept is not None)


def fit_collectives(samples: list[CollectiveSample], base: dict[tuple[str, int], tuple[float, float]],
                    profile: str) -> dict[tuple[str, int], tuple[LineFit, int]]:
    """(op, group) → (fit of t = α + S/β, distinct sizes) for every (op, group) the samples hold.

    Raises:
        CalibrationError: one distinct size and no base latency; a bandwidth the data leave
        undetermined (time not growing with size).
    """
    by_key: dict[tuple[str, int], dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for s in samples:
        by_key[(s.op, s.group)][s.nbytes].append(s.seconds)
    out = {}
    for (op, group), sizes in sorted(by_key.items()):
        xs = np.array(sorted(sizes), dtype=float)
        ts = np.array([np.median(sizes[int(x)]) for x in xs])
        if len(xs) < SAMPLES_PER_TERM * 2:
            if (op, group) not in base:
                raise CalibrationError(f"{op} on {group} ranks: {len(xs)} distinct size(s) cannot separate latency "
                                       f"from bandwidth, and profile '{profile}' has no {op} terms for {group} ranks "
                                       "to keep the latency from: record more sizes (python -m zsim.runtime.hostprobe, or "
                                       "runs of other model shapes)")
            fit = relative_line(xs, ts, intercept=base[(op, group)][0])
        else:
            fit = relative_line(xs, ts)
        if fit.slopes[0] <= 0:
            raise CalibrationError(f"{op} on {group} ranks: the time does not grow with the size over "
                                   f"{int(xs[0])}-{int(xs[-1])} B, so the bandwidth is not determined by these data")
        out[(op, group)] = (fit, len(xs))
    return out


COMPUTE_TERMS = ("op_overhead_us", "matmul_GFLOPS", "memory_GBps")


def match_total(fit: LineFit, xs: np.ndarray, ts: np.ndarray, fixed: np.ndarray | None = None) -> LineFit:
    """`fit` (no intercept) with its slopes scaled so that its predictions sum to the measured total
    Σ ts (the module docstring says why). `fixed`, per row, is time the fit does not own (a term kept
    from the base profile), left unscaled and subtracted from the total first."""
    fixed = np.zeros(len(ts)) if fixed is None else fixed
    own = xs @ np.array(fit.slopes)
    if own.sum() <= 0:
        return fit
    factor = float((ts.sum() - fixed.sum()) / own.sum())
    slopes = tuple(s * factor for s in fit.slopes)
    predicted = xs @ np.array(slopes) + fixed
    return LineFit(fit.intercept, slopes, tuple(float(v) for v in predicted / ts - 1.0), fit.intercept_kept)


def fit_compute(rows: list[tuple[int, float, float, float]], base_bytes_per_s: float | None = None
                ) -> tuple[LineFit, bool]:
    """(fit, bandwidth kept) of t = launches·o + flops/T + bytes/M over (launches, flops, bytes, seconds)
    rows: o is the framework's time per aten op (what `python -m zsim.runtime.hostprobe` measures as
    one tiny op's dispatch), paid once per kernel of the op's kernel list, so a layer of 28 ops pays it
    28 times and an optimizer copy once. Relative weighting: every op's relative error counts alike.
    Where the bytes do not explain the times (the term at its bound, or moving no op's time by 1%: a
    model's layers of two widths can stream the same bytes), the bandwidth is not determined: it is
    kept at `base_bytes_per_s` (the base profile's) and said so;
    the slopes are then (o, 1/T, 1/base).

    (Two earlier forms failed on this machine's traces: one overhead per plan op, relatively weighted,
    let the 0.5-ms embedding and optimizer ops pull the matmul rate to 4x what the layers achieve; the
    same weighted by seconds made the overhead 3.4 ms a plan op and small ops 20x too slow.)

    Raises:
        CalibrationError: too few distinct ops, or a term the data leave undetermined (the bandwidth:
        only without a base to keep).
    """
    groups: dict[tuple[int, float, float], list[float]] = defaultdict(list)
    for launches, flops, nbytes, seconds in rows:
        if seconds > 0:
            groups[(launches, flops, nbytes)].append(seconds)
    if len(groups) < SAMPLES_PER_TERM * 3:
        raise CalibrationError(f"{len(groups)} distinct compute ops (launches, FLOPs, bytes) cannot determine the 3 "
                               f"compute terms ({', '.join(COMPUTE_TERMS)}); need {SAMPLES_PER_TERM * 3}: trace more "
                               "model shapes")
    kept = [r for r in rows if r[3] > 0]
    xs = np.array([r[:3] for r in kept], dtype=float)
    ts = np.array([r[3] for r in kept])
    fit, bandwidth_kept = relative_line(xs, ts, intercept=0.0), False
    # undetermined: the bytes term is at its bound or moves no op's time by 1%
    undetermined = fit.slopes[2] <= 0 or float(np.max(xs[:, 2] * fit.slopes[2] / ts)) < 0.01
    if undetermined and not base_bytes_per_s:
        raise CalibrationError("memory_GBps: the compute times do not grow with the bytes of the ops, so it is not "
                               "determined by these traces, and the base profile has none to keep")
    if undetermined:
        kept = xs[:, 2] / base_bytes_per_s
        inner = match_total(relative_line(xs[:, :2], ts - kept, intercept=0.0), xs[:, :2], ts, fixed=kept)
        fit = LineFit(0.0, (*inner.slopes, 1.0 / base_bytes_per_s), inner.errors, True)
        bandwidth_kept = True
    else:
        fit = match_total(fit, xs, ts)
    for name, slope, what in zip(COMPUTE_TERMS, fit.slopes, ("kernel launches", "FLOPs", "bytes")):
        if slope <= 0:
            raise CalibrationError(f"{name}: the compute times do not grow with the {what} of the ops, so it is "
                                   "not determined by these traces (trace model shapes that differ in it)")
    return fit, bandwidth_kept


def fit_optimizer(rows: list[tuple[int, float, float]]) -> LineFit | None:
    """t = launches·o + bytes/M over the optimizer's ops (launches, bytes, seconds): per-tensor norms
    and casts, the flat copy, Adam over the partition. They stream the partition from host memory (it
    does not fit in caches as a tiny layer's activations do) and dispatch ops outside autograd, so they
    get their own two terms; None (the general terms apply) when fewer than 4 distinct ops or a term
    the data leave undetermined."""
    groups = {(n, b) for n, b, t in rows if t > 0}
    if len(groups) < SAMPLES_PER_TERM * 2:
        return None
    kept = [r for r in rows if r[2] > 0]
    xs, ts = np.array([r[:2] for r in kept], dtype=float), np.array([r[2] for r in kept])
    fit = relative_line(xs, ts, intercept=0.0)
    return match_total(fit, xs, ts) if all(s > 0 for s in fit.slopes) else None

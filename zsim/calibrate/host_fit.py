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

A gloo line the samples do not determine (one size and no base latency, or a time that does not grow
with the size) is returned as undetermined, for the caller to keep from the base and list. Refusals
(CalibrationError) of the compute fit: fewer distinct samples than twice the terms, a rate whose
inverse hits 0 (time does not grow with the work) with no base to keep, no samples at all.
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


def relative_line(xs: np.ndarray, ts: np.ndarray, intercept: float | None = None, relative: bool = True,
                  of: np.ndarray | None = None) -> LineFit:
    """t ≈ a + xs·b with a, b ≥ 0, minimising Σ((prediction − t)/t)² (or Σ(prediction − t)² when not
    `relative`); `intercept` fixes a. `of`: the times the errors are relative to, where `ts` is what is
    left of them after a kept term (else `ts`): a remainder near 0 or below must not weigh without bound."""
    xs = np.atleast_2d(xs.T).T if xs.ndim == 1 else xs
    w = 1.0 / (ts if of is None else of) if relative else np.full(len(ts), 1.0 / float(np.mean(ts)))
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


# A term is determined by data whose time it moves: the bytes term of a gloo line must be at least this
# share of some size's time (the sensitivity rule of zsim.calibrate.nccl_fit, _SENSITIVITY = 1e-3).
MOVES = 1e-3


def fit_collectives(samples: list[CollectiveSample], base: dict[tuple[str, int], tuple[float, float]],
                    profile: str) -> tuple[dict[tuple[str, int], tuple[LineFit, int]], dict[tuple[str, int], str]]:
    """({(op, group): (fit of t = α + S/β, distinct sizes)} for every (op, group) the samples determine,
    {(op, group): why not} for the others). An (op, group) the samples do not determine (one distinct
    size and no base latency to keep; a time that does not grow with the size, e.g. the 4-byte loss
    all_reduce that is a run's only all_reduce) is not fitted: the caller keeps the base profile's
    terms for it (if any) and lists it, instead of refusing the whole calibration."""
    by_key: dict[tuple[str, int], dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for s in samples:
        by_key[(s.op, s.group)][s.nbytes].append(s.seconds)
    out, undetermined = {}, {}
    for (op, group), sizes in sorted(by_key.items()):
        xs = np.array(sorted(sizes), dtype=float)
        ts = np.array([np.median(sizes[int(x)]) for x in xs])
        span = f"{int(xs[0])} B" if len(xs) == 1 else f"{int(xs[0])}-{int(xs[-1])} B"
        probe = base.get((op, group))
        alpha, beta = probe if probe is not None else (0.0, 0.0)
        if probe is not None and beta > 0 and xs[-1] / beta < MOVES * (alpha + xs[-1] / beta):
            # at the base's terms the bytes are under 0.1% of even the largest size's time: noise in the
            # latency, not the bandwidth, is what a fit would read (the 4-byte loss all_reduce)
            undetermined[(op, group)] = (f"at {span} the bytes are under {MOVES:.1%} of the time (latency-bound): "
                                         "bandwidth not determined")
            continue
        if len(xs) < SAMPLES_PER_TERM * 2:
            if (op, group) not in base:
                undetermined[(op, group)] = (f"{len(xs)} distinct size(s) ({span}) cannot separate latency from "
                                             f"bandwidth, and profile '{profile}' has no latency to keep")
                continue
            fit = relative_line(xs, ts, intercept=base[(op, group)][0])
        else:
            fit = relative_line(xs, ts)
        if fit.slopes[0] <= 0:
            undetermined[(op, group)] = f"the time does not grow with the size over {span}: bandwidth not determined"
            continue
        out[(op, group)] = (fit, len(xs))
    return out, undetermined


COMPUTE_TERMS = ("op_overhead_us", "matmul_GFLOPS", "memory_GBps", "module_overhead_us")


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


def fit_compute(rows: list[tuple[int, float, float, float]], base_bytes_per_s: float | None = None,
                base_overhead_s: float | None = None, base_flops_per_s: float | None = None,
                hold_overhead: bool = False, reasons: dict[str, str] | None = None
                ) -> tuple[LineFit, tuple[str, ...]]:
    """(fit, names of the terms kept from the base) of t = c + launches·o + flops/T + bytes/M over
    (launches, flops, bytes, seconds) rows: o is the framework's time per kernel launch (aten op) of the
    op's kernel list, which `python -m zsim.runtime.hostprobe` measures on a tiny transformer layer; c the
    runtime's time per op beyond its launches (the unit's module call, the ZeRO engine's hooks and
    parameter views, the trace span), which the probe's bare layer does not run. `hold_overhead` keeps o
    at the probe's `base_overhead_s` (the probe measures it; fitted beside c, the two trade against each
    other, as a layer's 28 launches against one op). Relative weighting: every op's relative error counts
    alike. A term the data do not determine (at its bound of 0, or moving no op's time by 1%: a model's
    layers of two widths can stream the same bytes; a noisy machine can hide the FLOPs) is kept at the
    base profile's value (`base_overhead_s`, `base_flops_per_s`, `base_bytes_per_s`; c at 0) and named;
    so is a matmul rate above the probe's; the others are fitted again without it. The slopes are always
    (o, 1/T, 1/M), kept ones included; c is the intercept. `reasons`, when given, gets why each kept term
    was kept, by name.

    (Earlier forms that failed on this machine's traces: one overhead per plan op instead of per launch,
    relatively weighted, let the 0.5-ms embedding and optimizer ops pull the matmul rate to 4x what the
    layers achieve; the same weighted by seconds made the overhead 3.4 ms a plan op and small ops 20x too
    slow; a per-launch overhead alone, fitted, came out 57-72 µs a launch, 5x the probe's layer, pricing
    a layer's many launches too dear and an embedding's few too cheap.)

    Raises:
        CalibrationError: too few distinct ops, or a term the data leave undetermined and the base
        has no value to keep.
    """
    groups: dict[tuple[int, float, float], list[float]] = defaultdict(list)
    for launches, flops, nbytes, seconds in rows:
        if seconds > 0:
            groups[(launches, flops, nbytes)].append(seconds)
    if len(groups) < SAMPLES_PER_TERM * 3:
        raise CalibrationError(f"{len(groups)} distinct compute ops (launches, FLOPs, bytes) cannot determine the 3 "
                               f"compute terms ({', '.join(COMPUTE_TERMS[:3])}); need {SAMPLES_PER_TERM * 3}: trace "
                               "more model shapes")
    used = [r for r in rows if r[3] > 0]
    xs = np.array([(*r[:3], 1.0) for r in used], dtype=float)
    ts = np.array([r[3] for r in used])
    base = (base_overhead_s, 1.0 / base_flops_per_s if base_flops_per_s else None,
            1.0 / base_bytes_per_s if base_bytes_per_s else None, 0.0)
    what = ("kernel launches", "FLOPs", "bytes", "ops")
    kept: list[int] = [0] if hold_overhead and base_overhead_s else []
    why = {0: "held at the probe's, which times a transformer layer's launches (the runtime's per-op cost, "
              "module_overhead_us, is fitted beside it)"} if kept else {}
    while True:
        free = [i for i in range(4) if i not in kept]
        fixed = xs[:, kept] @ np.array([base[i] for i in kept]) if kept else np.zeros(len(ts))
        inner = match_total(relative_line(xs[:, free], ts - fixed, intercept=0.0, of=ts), xs[:, free], ts, fixed=fixed)
        slopes = dict(zip(free, inner.slopes))
        # undetermined: at its bound (0), or moving no op's time by 1%
        stuck = [i for i in free if slopes[i] <= 0 or float(np.max(xs[:, i] * slopes[i] / ts)) < 0.01]
        # a matmul rate above the probe's: the probe timed torch.mm on the runtime's own GEMM shapes with every
        # rank at once (zsim.runtime.hostprobe), so no op of the run can multiply faster; a fit that says so has
        # traded FLOPs against the per-op overhead, which the ops of one shape cannot tell apart
        for i in stuck:
            why.setdefault(i, "not determined by these traces (at its bound, or no op's time moves 1% with it); "
                              "the base's kept")
        if 1 in free and 1 not in stuck and base[1] is not None and 0 < slopes[1] < base[1]:
            stuck.append(1)
            why[1] = "the fit went above the probe's rate, which no op of the run can beat: held at the probe's"
        if not stuck:
            break
        missing = [i for i in stuck if base[i] is None or (base[i] <= 0 and i != 3)]
        if missing:
            i = missing[0]
            raise CalibrationError(f"{COMPUTE_TERMS[i]}: the compute times do not grow with the {what[i]} of the ops, "
                                   "so it is not determined by these traces, and the base profile has none to keep "
                                   "(trace model shapes that differ in it)")
        kept += stuck
        if len(kept) == 4:
            break
    full = tuple(slopes[i] if i in slopes and i not in kept else base[i] for i in range(4))
    predicted = xs @ np.array(full)
    fit = LineFit(full[3], full[:3], tuple(float(v) for v in predicted / ts - 1.0), bool(kept))
    # c kept at 0 is "none", not a base value: not listed
    names = tuple(COMPUTE_TERMS[i] for i in sorted(kept) if i != 3 or full[3] > 0)
    if reasons is not None:
        reasons.update({COMPUTE_TERMS[i]: why[i] for i in sorted(kept) if COMPUTE_TERMS[i] in names})
    return fit, names


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

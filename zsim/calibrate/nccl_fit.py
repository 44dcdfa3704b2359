"""Fit a profile's NCCL kernel terms (zsim.fabric.nccl.NcclKernel) to measured collectives.

The structure is fixed: NCCL's own tuner picks the algorithm and protocol for every sample, the
fabric gives the bottleneck link, and the launch floor, protocol efficiencies, latencies and
element-wise-path bandwidths are free. They are fitted by least squares on log(time) over every
sample (scipy.optimize.least_squares, trust-region reflective with bounds), so large and small sizes
weigh alike. Samples come from nccl-tests tables, Kineto traces or runtime traces alike
(zsim.trace.samples.CollectiveSample: transfer time, waiting excluded).

Only terms the data can move are fitted: a term whose change by a factor e moves no sample's
predicted time by 0.1% (e.g. LL's efficiency when every LL sample sits under the launch floor) is
kept at the base profile's value and reported as kept. A fitted term that ends on an artificial
bound (not a physical one such as a latency of 0) means the model does not fit the data; callers
refuse to write such a profile (zsim.calibrate.profile_fit).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from zsim.calibrate.optimizer import scipy_optimize
from zsim.fabric.cluster import Cluster
from zsim.fabric.nccl import BASE_LAT_US, HW_LAT_US, LL128_CEILING, LL128_COLLECTIVES, PROTOCOLS, NcclKernel
from zsim.fabric.perf import run_collective
from zsim.fabric.topology import aggregate_capacities, build_topology
from zsim.trace.nccl_tests import NcclRow
from zsim.trace.samples import CollectiveSample

class Term(NamedTuple):
    """One fitted term, in profile units (µs, GB/s): its neutral start and bounds, and whether ending on
    a bound is a real answer (a latency of 0: "too small to measure"; LL128 at 120/128: the protocol's
    ceiling) or means the model does not fit (an efficiency of 0.01)."""

    name: str
    start: float
    lo: float
    hi: float
    lo_physical: bool = False
    hi_physical: bool = False


_PARAMS = (
    Term("launch_us", 5.0, 0.0, 50.0, lo_physical=True),
    Term("efficiency.LL", 0.5, 0.01, 1.0),
    Term("efficiency.Simple", 0.5, 0.01, 1.0),
    *(Term(f"efficiency.LL128.{fn}", 0.5, 0.01, LL128_CEILING, hi_physical=True) for fn in LL128_COLLECTIVES),
    *(Term(f"latency_us.{p}", 10.0, 0.0, 500.0, lo_physical=True) for p in PROTOCOLS),
    *(Term(f"step_latency_us.{p}", 1.0, 0.0, 50.0, lo_physical=True) for p in PROTOCOLS),
    Term("unaligned_copy_GBps", 60.0, 1.0, 1000.0),
    Term("unaligned_reduce_GBps", 40.0, 1.0, 1000.0),
)
NAMES = tuple(p.name for p in _PARAMS)

# A weak prior on the latency terms: NCCL's own ring/NVLink latencies (tuning.cc baseLat, hwLat).
# Samples that a host launch floor hides cannot identify a latency; the prior keeps it where NCCL's
# authors measured it instead of letting it trade off against the floor.
def _prior(tuner: str) -> dict[str, float]:
    """The latency terms NCCL's authors measured, in the tuner of the release the system ran."""
    return {**{f"latency_us.{p}": BASE_LAT_US[tuner]["ring"][i] for i, p in enumerate(PROTOCOLS)},
            **{f"step_latency_us.{p}": HW_LAT_US[tuner]["nvlink"]["ring"][i] for i, p in enumerate(PROTOCOLS)}}
_PRIOR_WEIGHT = 0.05  # per term, against one log-time residual per sample
# A term is undetermined when changing it by a factor e moves no sample's log time by this much.
_SENSITIVITY = 1e-3
# Log-time residual RMS at which the prior gets its full weight: the DGX-2 nccl-tests fit's is ~0.1.
_NOISE_RMS = 0.1


def kernel_from(values: dict[str, float]) -> NcclKernel:
    """An NcclKernel from profile-unit values keyed as in `_PARAMS`."""
    return NcclKernel(
        efficiency={p: values[f"efficiency.{p}"] for p in ("LL", "Simple")},
        ll128_efficiency={fn: values[f"efficiency.LL128.{fn}"] for fn in LL128_COLLECTIVES},
        latency_s={p: values[f"latency_us.{p}"] * 1e-6 for p in PROTOCOLS},
        step_latency_s={p: values[f"step_latency_us.{p}"] * 1e-6 for p in PROTOCOLS},
        launch_s=values["launch_us"] * 1e-6,
        unaligned_copy_Bps=values["unaligned_copy_GBps"] * 1e9,
        unaligned_reduce_Bps=values["unaligned_reduce_GBps"] * 1e9,
    )


def values_of(kernel: NcclKernel) -> dict[str, float]:
    """The profile-unit values of `kernel` (the inverse of kernel_from)."""
    out = {"launch_us": kernel.launch_s * 1e6, "unaligned_copy_GBps": kernel.unaligned_copy_Bps / 1e9,
           "unaligned_reduce_GBps": kernel.unaligned_reduce_Bps / 1e9}
    for fn in LL128_COLLECTIVES:
        out[f"efficiency.LL128.{fn}"] = kernel.share("LL128", fn)
    for p in PROTOCOLS:
        if p != "LL128":
            out[f"efficiency.{p}"] = kernel.efficiency[p]
        out[f"latency_us.{p}"] = kernel.latency_s[p] * 1e6
        out[f"step_latency_us.{p}"] = kernel.step_latency_s[p] * 1e6
    return out


@dataclass(frozen=True, slots=True)
class Residual:
    fn: str
    size: int
    measured_busbw: float
    simulated_busbw: float
    algorithm: str
    group: int = 0
    source: str = ""

    @property
    def error(self) -> float:
        """Relative busbw error, simulated / measured − 1 (= measured time / simulated time − 1)."""
        return self.simulated_busbw / self.measured_busbw - 1.0


@dataclass(frozen=True, slots=True)
class FitResult:
    values: dict[str, float]
    residuals: list[Residual]
    fitted: tuple[str, ...] = NAMES
    kept: tuple[str, ...] = ()
    at_bounds: tuple[str, ...] = ()  # fitted terms on an artificial bound: the model does not fit

    def summary(self, min_size: int = 1 << 20) -> dict[str, tuple[float, float]]:
        """Per collective: (median, max) |busbw error| over samples of at least `min_size` bytes
        (all samples if none is that large)."""
        out = {}
        for fn in sorted({r.fn for r in self.residuals}):
            rows = [r for r in self.residuals if r.fn == fn]
            errs = [abs(r.error) for r in rows if r.size >= min_size] or [abs(r.error) for r in rows]
            out[fn] = (float(np.median(errs)), float(max(errs)))
        return out


def table_samples(tables: dict[str, list[NcclRow]], gpus: int, gpus_per_process: int,
                  source: str = "nccl-tests") -> list[CollectiveSample]:
    """nccl-tests rows with a payload and a time, as samples."""
    return [CollectiveSample(fn, r.size, gpus, r.time_us * 1e-6, "nccl", source, gpus_per_process)
            for fn, rows in tables.items() for r in rows if r.size > 0 and r.time_us > 0]


def _cluster_for(cluster: Cluster, group: int) -> Cluster:
    """The cluster with as many nodes as a group of `group` ranks packed onto nodes needs."""
    return dataclasses.replace(cluster, nodes=max(1, math.ceil(group / cluster.gpus_per_node)))


def _predict(cluster: Cluster, sample: CollectiveSample, capacity: dict, simulate: bool = False):
    c = _cluster_for(cluster, sample.group)
    return run_collective(c, sample.op, sample.nbytes, sample.group, sample.gpus_per_process,
                          simulate=simulate, capacity=capacity[c.nodes])


def _capacities(cluster: Cluster, samples: list[CollectiveSample]) -> dict[int, dict]:
    nodes = {_cluster_for(cluster, s.group).nodes for s in samples}
    return {n: aggregate_capacities(build_topology(dataclasses.replace(cluster, nodes=n)),
                                    dataclasses.replace(cluster, nodes=n)) for n in nodes}


def residuals_of(cluster: Cluster, samples: list[CollectiveSample], simulate: bool = False) -> list[Residual]:
    """Simulated against measured bus bandwidth of every sample."""
    capacity = _capacities(cluster, samples)
    out = []
    for s in samples:
        sim = _predict(cluster, s, capacity, simulate)
        measured_busbw = s.nbytes / s.seconds / 1e9 * (sim.busbw / sim.algbw if sim.algbw else 1.0)
        out.append(Residual(s.op, s.nbytes, measured_busbw, sim.busbw, sim.algorithm, s.group, s.source))
    return out


def evaluate(cluster: Cluster, tables: dict[str, list[NcclRow]], gpus: int, gpus_per_process: int,
             simulate: bool = False) -> list[Residual]:
    """Simulated against measured busbw for every nccl-tests row with a non-zero payload."""
    rows = [(fn, r) for fn, rs in tables.items() for r in rs if r.size > 0 and r.busbw > 0]
    capacity = aggregate_capacities(build_topology(cluster), cluster)
    out = []
    for fn, row in rows:
        sim = run_collective(cluster, fn, row.size, gpus, gpus_per_process, simulate=simulate, capacity=capacity)
        out.append(Residual(fn, row.size, row.busbw, sim.busbw, sim.algorithm, gpus))
    return out


def fit(cluster: Cluster, tables: dict[str, list[NcclRow]], gpus: int, gpus_per_process: int,
        prior_weight: float = _PRIOR_WEIGHT) -> FitResult:
    """Fit every NCCL kernel term to nccl-tests tables from a neutral start (`zsim nccl-fit`).
    `prior_weight` (0 = none) weighs the pull of the latency terms toward NCCL's own (_prior)."""
    result = fit_samples(cluster, table_samples(tables, gpus, gpus_per_process), prior_weight,
                         start={p.name: p.start for p in _PARAMS}, free=NAMES, scaled_prior=False)
    fitted = dataclasses.replace(cluster, nccl=kernel_from(result.values))
    return dataclasses.replace(result, residuals=evaluate(fitted, tables, gpus, gpus_per_process))


def sensitive_terms(cluster: Cluster, samples: list[CollectiveSample], values: dict[str, float]) -> tuple[str, ...]:
    """The terms whose change moves some sample's predicted time (finite differences in log space)."""
    capacity = _capacities(cluster, samples)

    def log_times(v: dict[str, float]) -> np.ndarray:
        c = dataclasses.replace(cluster, nccl=kernel_from(v))
        return np.log([_predict(c, s, capacity).time_us for s in samples])

    base = log_times(values)
    out = []
    for name in NAMES:
        lo, hi = next((p.lo, p.hi) for p in _PARAMS if p.name == name)
        probe = dict(values)
        v = values[name]
        probe[name] = min(hi, max(lo, v * 1.05 if v > 0 else 1e-3 * (hi - lo))) if v * 1.05 <= hi else v / 1.05
        step = abs(math.log(max(probe[name], 1e-12) / max(v, 1e-12))) or 1.0
        if np.max(np.abs(log_times(probe) - base)) / step >= _SENSITIVITY:
            out.append(name)
    return tuple(out)


def fit_samples(cluster: Cluster, samples: list[CollectiveSample], prior_weight: float = _PRIOR_WEIGHT,
                start: dict[str, float] | None = None, free: tuple[str, ...] | None = None,
                scaled_prior: bool = True) -> FitResult:
    """Least-squares fit of the NCCL kernel terms to `samples`; terms outside `free` (default: the
    ones the samples are sensitive to, at the cluster's current values) stay at `start` (default:
    the cluster's current values). With `scaled_prior`, the latency prior's weight scales with the
    noise of the data (none for data the model reproduces exactly). Returns the values, the fitted and kept terms, the fitted terms
    that ended on an artificial bound, and every sample's residual."""
    start = dict(start or values_of(cluster.nccl))
    free = sensitive_terms(cluster, samples, start) if free is None else free
    capacity = _capacities(cluster, samples)
    index = {p.name: p for p in _PARAMS}
    weight = prior_weight
    prior_terms = _prior(cluster.nccl_tuner)

    def residuals(x: np.ndarray) -> np.ndarray:
        values = {**start, **dict(zip(free, x))}
        c = dataclasses.replace(cluster, nccl=kernel_from(values))
        data = [np.log(_predict(c, s, capacity).time_us * 1e-6 / s.seconds) for s in samples]
        prior = [weight * np.log((values[k] + 1.0) / (v + 1.0)) for k, v in prior_terms.items() if k in free]
        return np.array(data + prior)

    values = dict(start)
    if free:
        optimize = scipy_optimize("the NCCL fit (zsim nccl-fit, zsim calibrate)")
        lo = np.array([index[n].lo for n in free])
        hi = np.array([index[n].hi for n in free])
        x0 = np.clip([start[n] for n in free], lo + 1e-9 * (hi - lo), hi - 1e-9 * (hi - lo))
        weight = prior_weight
        if scaled_prior and prior_weight > 0:
            # The prior arbitrates between terms that noisy data cannot separate; its pull scales with
            # the noise: the RMS log-time residual of a fit without it, against _NOISE_RMS.
            weight = 0.0
            plain = optimize.least_squares(residuals, x0, bounds=(lo, hi), x_scale="jac", ftol=1e-8, xtol=1e-8, max_nfev=300)
            rms = float(np.sqrt(np.mean(plain.fun ** 2)))
            weight = prior_weight * min(1.0, rms / _NOISE_RMS)
            x0 = plain.x
        tol = 1e-8 if weight == 0 else 1e-5
        solution = optimize.least_squares(residuals, x0, bounds=(lo, hi), x_scale="jac", ftol=tol, xtol=tol, max_nfev=300)
        values.update(zip(free, (float(v) for v in solution.x)))
    def on_artificial_bound(n: str) -> bool:
        t = index[n]
        return ((not t.lo_physical and abs(values[n] - t.lo) <= 1e-6 * t.hi)
                or (not t.hi_physical and abs(values[n] - t.hi) <= 1e-6 * t.hi))
    at_bounds = tuple(n for n in free if on_artificial_bound(n))
    fitted = dataclasses.replace(cluster, nccl=kernel_from(values))
    return FitResult(values, residuals_of(fitted, samples), tuple(free),
                     tuple(n for n in NAMES if n not in free), at_bounds)

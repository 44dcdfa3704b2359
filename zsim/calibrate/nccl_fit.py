"""Fit a profile's NCCL kernel terms (zsim.fabric.nccl.NcclKernel) to nccl-tests tables.

The structure is fixed: NCCL's own tuner picks the algorithm and protocol for every row, the fabric
gives the bottleneck link, and the launch floor, protocol efficiencies, latencies and unaligned-path
bandwidths are free. They are fitted by least squares on log(time) over every row of every table
(scipy.optimize.least_squares, trust-region reflective with bounds), so large and small sizes weigh
alike. The residuals say where the structure falls short.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from zsim.config.hardware import Cluster
from zsim.fabric.nccl import BASE_LAT_US, HW_LAT_US, PROTOCOLS, NcclKernel
from zsim.fabric.perf import run_collective
from zsim.fabric.topology import aggregate_capacities, build_topology
from zsim.trace.nccl_tests import NcclRow

# name, initial value, lower, upper bound; SI-free units as in the profile (µs, GB/s, fractions).
_PARAMS = (
    ("launch_us", 5.0, 0.0, 50.0),
    *((f"efficiency.{p}", 0.5, 0.01, 1.0) for p in PROTOCOLS),
    *((f"latency_us.{p}", 10.0, 0.0, 500.0) for p in PROTOCOLS),
    *((f"step_latency_us.{p}", 1.0, 0.0, 50.0) for p in PROTOCOLS),
    ("unaligned_copy_GBps", 60.0, 1.0, 1000.0),
    ("unaligned_reduce_GBps", 40.0, 1.0, 1000.0),
)


# A weak prior on the latency terms: NCCL's own ring/NVLink latencies (tuning.cc baseLat, hwLat).
# Rows that a host launch floor hides cannot identify a latency; the prior keeps it where NCCL's
# authors measured it instead of letting it trade off against the floor.
_PRIOR = {**{f"latency_us.{p}": BASE_LAT_US["ring"][i] for i, p in enumerate(PROTOCOLS)},
          **{f"step_latency_us.{p}": HW_LAT_US["nvlink"]["ring"][i] for i, p in enumerate(PROTOCOLS)}}
_PRIOR_WEIGHT = 0.05  # per term, against one log-time residual per row


def kernel_from(values: dict[str, float]) -> NcclKernel:
    """An NcclKernel from profile-unit values keyed as in `_PARAMS`."""
    return NcclKernel(
        efficiency={p: values[f"efficiency.{p}"] for p in PROTOCOLS},
        latency_s={p: values[f"latency_us.{p}"] * 1e-6 for p in PROTOCOLS},
        step_latency_s={p: values[f"step_latency_us.{p}"] * 1e-6 for p in PROTOCOLS},
        launch_s=values["launch_us"] * 1e-6,
        unaligned_copy_Bps=values["unaligned_copy_GBps"] * 1e9,
        unaligned_reduce_Bps=values["unaligned_reduce_GBps"] * 1e9,
    )


@dataclass(frozen=True, slots=True)
class Residual:
    fn: str
    size: int
    measured_busbw: float
    simulated_busbw: float
    algorithm: str

    @property
    def error(self) -> float:
        """Relative busbw error, simulated / measured − 1."""
        return self.simulated_busbw / self.measured_busbw - 1.0


@dataclass(frozen=True, slots=True)
class FitResult:
    values: dict[str, float]
    residuals: list[Residual]

    def summary(self, min_size: int = 1 << 20) -> dict[str, tuple[float, float]]:
        """Per collective: (median, max) |busbw error| over rows of at least `min_size` bytes."""
        out = {}
        for fn in sorted({r.fn for r in self.residuals}):
            errs = [abs(r.error) for r in self.residuals if r.fn == fn and r.size >= min_size]
            if errs:
                out[fn] = (float(np.median(errs)), float(max(errs)))
        return out


def evaluate(cluster: Cluster, tables: dict[str, list[NcclRow]], gpus: int, gpus_per_process: int,
             simulate: bool = False) -> list[Residual]:
    """Simulated against measured busbw for every row with a non-zero payload."""
    capacity = aggregate_capacities(build_topology(cluster), cluster)
    out = []
    for fn, rows in tables.items():
        for row in rows:
            if row.size <= 0 or row.busbw <= 0:
                continue
            sim = run_collective(cluster, fn, row.size, gpus, gpus_per_process, simulate=simulate,
                                 capacity=capacity)
            out.append(Residual(fn, row.size, row.busbw, sim.busbw, sim.algorithm))
    return out


def fit(cluster: Cluster, tables: dict[str, list[NcclRow]], gpus: int, gpus_per_process: int,
        prior_weight: float = _PRIOR_WEIGHT) -> FitResult:
    """Least-squares fit of the NCCL kernel terms; returns the values (profile units) and residuals.
    `prior_weight` (0 = none) weighs the pull of the latency terms toward NCCL's own (_PRIOR).

    Rows with zero payload or zero time are skipped; the fit uses the closed form of an uncontended
    collective, which the simulated fabric reproduces exactly (tests/test_fabric.py).
    """
    capacity = aggregate_capacities(build_topology(cluster), cluster)
    rows = [(fn, r) for fn, rs in tables.items() for r in rs if r.size > 0 and r.time_us > 0]
    names = [p[0] for p in _PARAMS]

    def residuals(x: np.ndarray) -> np.ndarray:
        values = dict(zip(names, x))
        c = dataclasses.replace(cluster, nccl=kernel_from(values))
        data = [np.log(run_collective(c, fn, r.size, gpus, gpus_per_process, simulate=False,
                                      capacity=capacity).time_us / r.time_us) for fn, r in rows]
        prior = [prior_weight * np.log((values[k] + 1.0) / (v + 1.0)) for k, v in _PRIOR.items()]
        return np.array(data + prior)

    x0 = np.array([p[1] for p in _PARAMS])
    solution = least_squares(residuals, x0, bounds=([p[2] for p in _PARAMS], [p[3] for p in _PARAMS]),
                             x_scale="jac", ftol=1e-5, xtol=1e-5, max_nfev=200)
    values = dict(zip(names, (float(v) for v in solution.x)))
    fitted = dataclasses.replace(cluster, nccl=kernel_from(values))
    return FitResult(values, evaluate(fitted, tables, gpus, gpus_per_process))

"""What a CUDA-event span of a runtime trace measures, split into the host's part and the GPU's.

On a GPU the runtime stamps each compute span with two CUDA events on the compute stream and records
apart `host_us`, the host time between the two stamps (runtime/tracer.py). The device duration `dur`
runs from the first event executing to the second: the span's kernels plus any time the GPU sat
waiting for the host to launch them. Two ways the two could combine:

* max: the host runs ahead of the GPU (launches are asynchronous), so a span lasts as long as the
  slower of the two, `dur ≈ max(device work, host time)` (the simulator's list_seconds);
* sum: the GPU waits for all of the host's work, `dur ≈ device work + host time`.

`combination` decides from the spans: under the sum, a span can never be shorter than its host time
plus its FLOPs at the GPU's dense peak (a lower bound of any device work); under the max, never
shorter than the larger of the two (unless the GPU was still busy with earlier work when the host
began the span). On the 2026-11-26 H200 runs (data/device/20261126-h200), of the spans after the warm-up
step the sum cannot explain 77 of 96 (h1024), 24 of 60 (h4096) and 53 of 72 (h2048), the max 14, 4
and 5: the max is what happens. A span much longer than its host time
(`DEVICE_BOUND`) is then the GPU's work alone; a span not much longer than its host time is set by
the host, whose time is `host_us` plus the compute stream's idle time just before the span (the
framework's work between spans, which the GPU waited out).

The host side is fitted here, apart from the device terms (zsim.calibrate.gpu_phase_fit fits those on
the device-bound spans only): `host_s = host_module_s + launches × host_op_s` (the simulator's
host bound, zsim.compute.model.list_seconds), non-negative linear least squares on relative residuals
over the host-bound spans.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from zsim.trace.tracks import stream_of

# A span at least this many times its host time is device-bound: the host launched its kernels in
# under 1/1.2 of the span, so the GPU, not the launches, set its length (the GPU idles at most for the
# first launch). Shorter spans count as host-bound: they feed the host fit, never the device one (a span
# barely longer than its host time may hide GPU work up to its length). A modelling choice, made before the held-out run was scored: between 1.1 and 1.5 on the H200
# runs the memory-bound terms move (kernel_us 4.6 to 0.2 µs: weakly determined by these spans) while the
# errors hardly do (in sample 20-21%, held-out h2048 median 40.0-41.8%; benchmarks/gpu_span_holdout.py).
DEVICE_BOUND = 1.2


@dataclass(frozen=True, slots=True)
class SpanSample:
    """One compute op of a CUDA-event-timed run, median over ranks, in seconds: `device_s` the span's own
    device duration (nested spans excluded), `host_s` its own host time (nested spans' host time
    excluded) plus the compute stream's idle time just before it (`gap_s`)."""

    device_s: float
    host_s: float
    gap_s: float

    @property
    def device_bound(self) -> bool:
        return self.device_s >= DEVICE_BOUND * (self.host_s - self.gap_s)

    @property
    def measured_s(self) -> float:
        """What the simulator's op must last for the step to come out right: the span and the idle
        time before it (the ops of a plan run back to back)."""
        return self.device_s + self.gap_s


def is_span_timed(run: Any) -> bool:
    """Whether every compute span of a runtime run carries CUDA-event timing and its host time."""
    from zsim.calibrate.replay import is_collective

    if run.metadata.get("source") == "simulated":
        return False
    spans = [e for events in run.events.values() for e in events if e.get("ph") == "X" and stream_of(e) == 0
             and not str(e.get("name", "")).startswith("wait/") and not is_collective(e)]
    return bool(spans) and all(e.get("args", {}).get("timing") == "cuda_event" and "host_us" in e.get("args", {})
                               for e in spans)


def own_host_us(events: list[dict[str, Any]]) -> dict[int, float]:
    """id(span) → its host time less the host time of the compute spans nested in it (a checkpointed
    block's backward holds its recomputation), µs."""
    spans = sorted((e for e in events if e.get("ph") == "X" and stream_of(e) == 0 and "host_us" in e.get("args", {})),
                   key=lambda e: (e["ts"], -e["dur"]))
    own = {id(e): float(e["args"]["host_us"]) for e in spans}
    stack: list[dict[str, Any]] = []
    for e in spans:
        while stack and e["ts"] >= stack[-1]["ts"] + stack[-1]["dur"]:
            stack.pop()
        if stack:  # directly nested in the span on top
            own[id(stack[-1])] -= float(e["args"]["host_us"])
        stack.append(e)
    return {k: max(0.0, v) for k, v in own.items()}


def span_samples(run: Any, profile: str, profiles: Any = None) -> list[tuple[Any, SpanSample]]:
    """(plan op, SpanSample) for every compute op of `run`'s plan rebuilt on `profile`, after the
    warm-up step, each the median over ranks of the span lined up with it (name, step, micro-batch,
    occurrence).

    Raises:
        ConfigError: the run cannot be rebuilt on the profile.
        CalibrationError: a compute op of the plan that the trace lacks.
    """
    from zsim.calibrate.collectives import CalibrationError
    from zsim.calibrate.host_calibration import compute_keys, idle_before
    from zsim.calibrate.rebuild import rebuild
    from zsim.calibrate.replay import is_collective, keyed
    from zsim.workload.transformer import build_workload
    from zsim.zero.plan import build_plan

    scenario = rebuild(run, profile, profiles)
    plan = build_plan(scenario, build_workload(scenario.model, scenario.parallel.mp, scenario.precision.dtype))
    ranks = [(keyed(events), idle_before(events), own_host_us(events)) for events in run.events.values()]
    rows, missing = [], []
    for op, key in compute_keys(plan):
        found = [(r[key]["dur"] - r[key]["args"].get("nested_us", 0.0), host.get(id(r[key]), 0.0), gaps.get(id(r[key]), 0.0))
                 for r, gaps, host in ranks if key in r and not is_collective(r[key])]
        if not found:
            missing.append(f"{op.name}@{op.step}.{op.micro_batch}")
            continue
        if op.step == 0:
            continue  # the first step warms up (allocation, cuBLAS heuristics)
        device, host, gap = (float(np.median(c)) * 1e-6 for c in zip(*found))
        rows.append((op, SpanSample(device, host + gap, gap)))
    if missing:
        raise CalibrationError(f"{run.folder}: {len(missing)} compute ops of the simulator's plan are not in the trace "
                               f"({', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''})")
    return rows


def combination(rows: list[tuple[Any, SpanSample]], peak_flops: float) -> dict[str, Any]:
    """Which combination of host and device time the spans show (module docstring), with the counts:
    the spans each reading cannot explain, shorter than host time + FLOPs at `peak_flops` (impossible
    under the sum) or shorter than the larger of the two (impossible under the max, unless the GPU was
    still busy with earlier work when the host began the span); the reading with fewer wins."""
    def lower(op: Any) -> float:
        return (op.flops or 0.0) / peak_flops  # no device work is shorter than its FLOPs at the dense peak

    under_sum = sum(1 for op, s in rows if s.device_s < (s.host_s - s.gap_s) + lower(op))
    under_max = sum(1 for op, s in rows if s.device_s < max(s.host_s - s.gap_s, lower(op)))
    return {"combination": "max" if under_sum > under_max else "sum", "spans": len(rows),
            "unexplained_by_sum": under_sum, "unexplained_by_max": under_max}


def host_count(op: Any) -> int:
    """Launches the simulator's host bound counts for `op` (its kernel list's); 0 for an op without a
    list, which the simulator prices by FLOPs and bytes alone (zsim.engine.compute)."""
    return op.kernels.launches if op.kernels is not None else 0


def fit_host(rows: list[tuple[Any, SpanSample]]) -> tuple[dict[str, float], int]:
    """({'host_op_us', 'host_module_us'}, host-bound spans used) from the host-bound spans of ops with a
    kernel list: non-negative least squares of host_s = host_module_s + launches × host_op_s, relative
    residuals. Empty terms when fewer than 4 such spans of 2 launch counts."""
    from scipy.optimize import lsq_linear

    used = [(op, s) for op, s in rows if not s.device_bound and op.kernels is not None]
    if len(used) < 4 or len({host_count(op) for op, _ in used}) < 2:
        return {}, len(used)
    a = np.array([[1.0, host_count(op)] for op, _ in used])
    y = np.array([s.host_s for _, s in used])
    sol = lsq_linear(a / y[:, None], np.ones(len(y)), bounds=(0.0, np.inf)).x
    return {"host_module_us": float(sol[0] * 1e6), "host_op_us": float(sol[1] * 1e6)}, len(used)


def host_seconds(op: Any, host: dict[str, float]) -> float:
    """The host bound of `op` under fitted `host` terms (µs values), seconds; 0 for a list-less op."""
    if op.kernels is None:
        return 0.0
    return (host["host_module_us"] + op.kernels.launches * host["host_op_us"]) * 1e-6

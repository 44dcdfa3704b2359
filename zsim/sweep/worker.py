"""What runs on a worker, whichever engine: simulate a chunk of points and return their rows.

A top-level function of an importable module, so that process pools and Dask workers can call it
(Dask workers need zsim installed, the same version: the point keys include it).
"""

from __future__ import annotations

import time
from typing import Any

from zsim.sweep.points import Point


Finished = tuple[int, dict[str, Any], dict[str, Any] | None, float, float]


def run_point(point: Point, with_facts: bool = False, plans: dict | None = None) -> Finished:
    """Simulate one point: (index, its row, its full result facts when `with_facts`, the
    simulation's wall seconds, the CPU seconds of the whole point in this process). The row holds no
    wall time: it is the same on every machine. `plans` reuses workloads and plans between points
    (zsim.engine.simulation.workload_and_plan)."""
    from zsim.engine.simulation import simulate
    from zsim.sweep.row import result_row

    cpu = time.process_time()
    result = simulate(point.scenario, trace=False, plans=plans)  # a row needs the totals, not the trace events
    row = result_row(result, point.oom_reason, point.capacity_bytes, point.key)
    full = None
    if with_facts:
        from zsim.report.facts import facts

        full = facts(result)
        if point.oom_reason:
            full["memory"]["oom_model_states"] = point.oom_reason
    return point.index, row, full, result.wall_seconds, time.process_time() - cpu


def run_chunk(points: list[Point], with_facts: bool = False) -> list[Finished]:
    """Simulate `points` one after another (chunks keep the per-point engine overhead low). Points that
    differ only in speeds (a bandwidth axis) share one workload and plan: building the plan was a
    fifth of simulating a flagship point."""
    plans: dict = {}
    return [run_point(p, with_facts, plans) for p in points]

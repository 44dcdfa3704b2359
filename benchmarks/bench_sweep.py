"""Speed of `zsim sweep`: a 1000-point sweep of the flagship, and what the engine costs per point.

Run: .venv/bin/python benchmarks/bench_sweep.py [--points 1000] [--workers 2] [--engine local|dask]
Target (issue 11): 1000 flagship points in under 60 s on 2 cores. Not a timed test: it prints

  plan         validating every point (build_scenario per point) before any runs
  run          the engine: first submission to last row back, cache writes included
  sim/point    mean simulate() wall time per point, measured inside the workers
  overhead     engine overhead per point = (workers × run − Σ simulate) / points: pickling, futures,
               cache writes, idle workers at the end; what the engine adds to the simulations
  serial       simulate() of one point in this process, wall and CPU: as `zsim run` calls it (trace
               events, its own plan) and as a sweep's worker does (no trace events, the plan shared
               with the chunk's other points, zsim.engine.simulation.workload_and_plan)
  cpu          the same measured in CPU seconds (this process and its worker processes, getrusage), and
               what the sweep would take on 2 idle cores: plan CPU + (all CPU of the run) / workers.
               On a shared, loaded machine wall times mostly measure the other tenants; CPU does not.

The axis is the inter-node bandwidth per NIC (`hardware.nic_Gbps`, log-spaced 25–6400 Gb/s) when the
schema has it (issue 9); otherwise the gradient bucket size, which costs a simulation as much.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from zsim.config.schema import HardwareSection
from zsim.config.struct import fields
from zsim.sweep.points import plan_sweep
from zsim.sweep.runner import run_sweep
from zsim.sweep.spec import sweep_from_mapping

ROOT = Path(__file__).resolve().parents[1]


def sweep_mapping(points: int) -> tuple[dict, str]:
    if "nic_Gbps" in fields(HardwareSection):
        axis = {"hardware.nic_Gbps": {"from": 25.0, "to": 6400.0, "num": points, "log": True}}
    else:
        axis = {"zero.reduce_bucket_elements": {"from": 10**6, "to": 10**6 + points - 1, "step": 1}}
    return {"name": "bench", "base": str(ROOT / "scenarios/1T-1024gpu.yaml"), "axes": axis}, next(iter(axis))


def cpu_seconds(work, repeat: int = 5) -> float:
    """The least CPU time (this process) of `repeat` calls of `work`: the other tenants of a shared
    machine only ever add to it."""
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        work()
        best = min(best, time.process_time() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--engine", choices=("local", "dask"), default="local")
    args = parser.parse_args()
    mapping, key = sweep_mapping(args.points)
    from zsim.scenario.scenario import load_scenario
    from zsim.engine.simulation import simulate

    scenario = load_scenario(ROOT / "scenarios/1T-1024gpu.yaml")
    serial = statistics.median(simulate(scenario).wall_seconds for _ in range(3))
    serial_cpu = cpu_seconds(lambda: simulate(scenario))
    plans: dict = {}
    simulate(scenario, trace=False, plans=plans)
    point_cpu = cpu_seconds(lambda: simulate(scenario, trace=False, plans=plans))
    out = Path(tempfile.mkdtemp(prefix="zsim-bench-sweep-"))
    try:
        started, cpu0 = time.perf_counter(), time.process_time()
        plan = plan_sweep(sweep_from_mapping(mapping), "<bench>", ROOT)
        plan_s, plan_cpu = time.perf_counter() - started, time.process_time() - cpu0
        self0, kids0 = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
        sweep = run_sweep(plan, out, engine=args.engine, workers=args.workers, write=False)
        total = time.perf_counter() - started
        self1, kids1 = (resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
        run_cpu = sum(b.ru_utime + b.ru_stime - a.ru_utime - a.ru_stime for a, b in ((self0, self1), (kids0, kids1)))
        cached_started = time.perf_counter()
        again = run_sweep(plan, out, engine=args.engine, workers=args.workers, write=False)
        rerun = time.perf_counter() - cached_started
    finally:
        shutil.rmtree(out, ignore_errors=True)
    n = len(plan.points)
    print(f"flagship sweep over {key}: {n} points, {args.engine} engine, {args.workers} workers")
    print(f"  plan        {plan_s:8.2f} s   ({plan_s / n * 1e3:.1f} ms a point, serial, in this process)")
    print(f"  run         {sweep.run_s:8.2f} s")
    print(f"  total       {total:8.2f} s   (target: < 60 s for 1000 points on 2 cores)")
    print(f"  sim/point   {sweep.sim_s / n * 1e3:8.1f} ms inside the workers; serial in this process "
          f"{serial * 1e3:.1f} ms")
    print(f"  serial cpu  {serial_cpu * 1e3:8.1f} ms CPU as `zsim run` simulates (trace, own plan); "
          f"{point_cpu * 1e3:.1f} ms as a sweep point (no trace, shared plan); fastest of 5")
    print(f"  overhead    {sweep.overhead_per_point_s * 1e3:8.2f} ms a point "
          f"({sweep.overhead_per_point_s / (sweep.sim_s / n):.1%} of a simulation)")
    print(f"  speed-up    {sweep.sim_s / sweep.run_s:8.2f}× over one process (ideal {args.workers}×)")
    print(f"  rerun       {rerun:8.2f} s   (all {again.cached} points from the cache, {again.ran} run)")
    if args.engine == "local":
        point_cpu = sweep.point_cpu_s / n
        print(f"  cpu         plan {plan_cpu:.2f} s ({plan_cpu / n * 1e3:.1f} ms a point); run {run_cpu:.2f} s in all, "
              f"{point_cpu * 1e3:.1f} ms a point simulating; engine overhead {(run_cpu - sweep.point_cpu_s) / n * 1e3:.2f} "
              f"ms CPU a point ({(run_cpu - sweep.point_cpu_s) / sweep.point_cpu_s:.1%})")
        print(f"  on {args.workers} idle cores: {plan_cpu + run_cpu / args.workers:8.2f} s   "
              f"(plan CPU + run CPU / workers)")


if __name__ == "__main__":
    main()

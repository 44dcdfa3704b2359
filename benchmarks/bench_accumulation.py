"""Where the flagship's time goes at gradient accumulation 1 and 64 (issue 28 item 9): CPU ms of the
plan build (zsim.engine.simulation.workload_and_plan), the simpy run (run_to_end) and the rest (setup,
the repeat proof and splice, the Result), median of 5, class mode without trace events.

Run: .venv/bin/python benchmarks/bench_accumulation.py   (prints a table; not a timed test)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import zsim.engine.simulation as simulation
from zsim.scenario.scenario import load_scenario

FLAGSHIP = Path(__file__).resolve().parents[1] / "scenarios/1T-1024gpu.yaml"


def timed_parts(accum: int, runs: int = 5) -> tuple[float, float, float]:
    """(total, plan build, simpy run) CPU seconds of the flagship at `accum` micro-batches of 64 sequences,
    the run with the median total of `runs`. Wraps the two functions on the module for the call only."""
    spent: dict[str, float] = {}

    def wrap(name: str, f: Callable) -> Callable:
        def timed(*args, **kwargs):
            start = time.process_time()
            try:
                return f(*args, **kwargs)
            finally:
                spent[name] = spent.get(name, 0.0) + time.process_time() - start
        return timed

    scenario = load_scenario(FLAGSHIP, [f"model.global_batch={64 * accum}"])
    originals = simulation.workload_and_plan, simulation.run_to_end
    simulation.workload_and_plan, simulation.run_to_end = wrap("plan", originals[0]), wrap("run", originals[1])
    try:
        simulation.simulate(scenario, mode="class", trace=False)  # warm caches
        rows = []
        for _ in range(runs):
            spent.clear()
            start = time.process_time()
            simulation.simulate(scenario, mode="class", trace=False)
            rows.append((time.process_time() - start, spent.get("plan", 0.0), spent.get("run", 0.0)))
    finally:
        simulation.workload_and_plan, simulation.run_to_end = originals
    return sorted(rows)[len(rows) // 2]


def main() -> None:
    print(f"{'grad_accum':>10}{'total ms':>10}{'plan ms':>9}{'run ms':>8}{'rest ms':>9}")
    for accum in (1, 2, 64):
        total, plan, run = timed_parts(accum)
        print(f"{accum:>10}{total * 1e3:>10.0f}{plan * 1e3:>9.0f}{run * 1e3:>8.0f}{(total - plan - run) * 1e3:>9.0f}")


if __name__ == "__main__":
    main()

"""Where the flagship's time goes at gradient accumulation 1 and 64 (issue 28 item 9): CPU ms of the
plan build (zsim.engine.simulation.workload_and_plan, or workload_and_unit where one micro-batch is
simulated), the simpy run (run_to_end: at 64 it holds the replay of the second micro-batch's memory,
zsim.engine.shifted_unit) and the rest (setup, the proof and splice, the Result), the least of 7
interleaved rounds, class mode without trace events, with each total as a multiple of
grad_accum 1's; then what replaying one micro-batch's ledger calls costs alone (replay_ms): with the second
micro-batch's plan, the floor of any exact proof that simulates one micro-batch (docs/fabric.md).

Run: .venv/bin/python benchmarks/bench_accumulation.py   (prints a table; not a timed test)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import zsim.engine.simulation as simulation
from zsim.engine.repeat import _MB
from zsim.memory.ledger import MemoryLedger
from zsim.scenario.scenario import load_scenario

FLAGSHIP = Path(__file__).resolve().parents[1] / "scenarios/1T-1024gpu.yaml"


def timed_parts(accums: tuple[int, ...], rounds: int = 7) -> dict[int, tuple[float, float, float]]:
    """Per grad_accum in `accums`: (total, plan build, simpy run) CPU seconds of the flagship at that many
    micro-batches of 64 sequences, the run with the least total of `rounds`, each round running every
    accumulation once in turn. The least, as timeit reports: what the code costs when nothing else on
    the shared machine gets in its way (a median moved by ±20% between runs of this benchmark, measured).
    Wraps the plan and run functions on the module for the call only."""
    spent: dict[str, float] = {}

    def wrap(name: str, f: Callable) -> Callable:
        def timed(*args, **kwargs):
            start = time.process_time()
            try:
                return f(*args, **kwargs)
            finally:
                spent[name] = spent.get(name, 0.0) + time.process_time() - start
        return timed

    scenarios = {accum: load_scenario(FLAGSHIP, [f"model.global_batch={64 * accum}"]) for accum in accums}
    originals = simulation.workload_and_plan, simulation.run_to_end, simulation.workload_and_unit
    simulation.workload_and_plan, simulation.run_to_end = wrap("plan", originals[0]), wrap("run", originals[1])
    simulation.workload_and_unit = wrap("plan", originals[2])
    rows: dict[int, list] = {accum: [] for accum in accums}
    try:
        for scenario in scenarios.values():
            simulation.simulate(scenario, mode="class", trace=False)  # warm caches
        for _ in range(rounds):
            for accum, scenario in scenarios.items():
                spent.clear()
                start = time.process_time()
                simulation.simulate(scenario, mode="class", trace=False)
                rows[accum].append((time.process_time() - start, spent.get("plan", 0.0), spent.get("run", 0.0)))
    finally:
        simulation.workload_and_plan, simulation.run_to_end, simulation.workload_and_unit = originals
    return {accum: min(r) for accum, r in rows.items()}


class _Recording(MemoryLedger):
    """A MemoryLedger that keeps every call made to it, in order, to replay them (replay_ms)."""

    calls: list

    def reserve_context(self, time: float, name: str, nbytes: int) -> None:
        self.calls.append(("reserve_context", time, name, nbytes))
        MemoryLedger.reserve_context(self, time, name, nbytes)

    def reserve_arena(self, time: float, name: str, nbytes: int) -> None:
        self.calls.append(("reserve_arena", time, name, nbytes))
        MemoryLedger.reserve_arena(self, time, name, nbytes)

    def alloc_many(self, time: float, requests, stream: str = "compute") -> None:
        requests = tuple(requests)
        self.calls.append(("alloc_many", time, requests, stream))
        MemoryLedger.alloc_many(self, time, requests, stream)

    def free_many(self, time: float, tags) -> None:
        tags = tuple(tags)
        self.calls.append(("free_many", time, tags))
        MemoryLedger.free_many(self, time, tags)


def replay_ms(runs: int = 5) -> tuple[float, int]:
    """(CPU ms, calls) of the GPU ledger's calls of the flagship's second micro-batch (grad_accum 2: from its
    first call tagged .m1 to the optimizer step's first allocation), made again on a ledger brought to the
    state they started from: what a proof that simulates one micro-batch and replays the memory of the
    next would pay on top of grad_accum 1, besides that micro-batch's plan (median of `runs`)."""
    scenario = load_scenario(FLAGSHIP, ["model.global_batch=128"])
    recorded: list = []

    def observe(run) -> None:
        run.ledger = _Recording(capacity=run.ledger.capacity)
        run.ledger.calls = recorded
        run.ledgers[0] = run.ledger

    simulation.simulate(scenario, mode="class", trace=False, repeat=False, observe=observe)

    def micro_batch(call) -> int:
        tag = call[2][0].tag if call[0] == "alloc_many" else call[2][0] if call[0] == "free_many" else ""
        found = _MB.search(tag)
        return int(found.group(1)) if found else -1

    first = next(k for k, c in enumerate(recorded) if micro_batch(c) == 1)
    last = next(k for k in range(first, len(recorded)) if recorded[k][0] == "alloc_many"
                and recorded[k][2][0].tag.startswith("optimizer."))
    times = []
    for _ in range(runs):
        ledger = MemoryLedger(capacity=scenario.cluster.gpu.memory_bytes)
        for name, *args in recorded[:first]:
            getattr(ledger, name)(*args)
        start = time.process_time()
        for name, *args in recorded[first:last]:
            getattr(ledger, name)(*args)
        times.append(time.process_time() - start)
    return sorted(times)[len(times) // 2] * 1e3, last - first


def main() -> None:
    """The table, with each row's total as a multiple of grad_accum 1's (issue 28: 64 within 1.5×; the
    same figure benchmarks/bench_run.py prints, from whole simulate() calls, as "CPU ×… of 1")."""
    print(f"{'grad_accum':>10}{'total ms':>10}{'plan ms':>9}{'run ms':>8}{'rest ms':>9}{'× of 1':>8}")
    parts = timed_parts((1, 2, 64))
    base = parts[1][0]
    for accum, (total, plan, run) in parts.items():
        print(f"{accum:>10}{total * 1e3:>10.0f}{plan * 1e3:>9.0f}{run * 1e3:>8.0f}{(total - plan - run) * 1e3:>9.0f}"
              f"{total / base:>8.2f}")
    replay, calls = replay_ms()
    print(f"\nthe second micro-batch's {calls} ledger calls, made again: {replay:.0f} ms of CPU")


if __name__ == "__main__":
    main()

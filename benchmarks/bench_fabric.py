"""Speed of the two simulation modes from 64 to 16,384 GPUs, and the nccl-tests calculator.

Run: .venv/bin/python benchmarks/bench_fabric.py [--full]   (prints a table; not a timed test)
Targets (issue: the network fabric): per-rank mode simulates a 1024-GPU ZeRO-3 step of the flagship
in under 60 s (issue 28: under 2 s, and 16,384 GPUs under 30 s); class mode stays under 2 s. The model is the flagship's (128 layers, MP 16, ZeRO-3,
one micro-batch per GPU) with the hidden size scaled so that it fits at every size: each rank runs
the same ops, and only the number of ranks grows. Per-rank mode stops at 4096 GPUs unless --full
(16,384 GPUs take a minute or two of CPU).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from zsim.scenario.scenario import load_scenario
from zsim.engine.simulation import simulate

ROOT = Path(__file__).resolve().parents[1]
FLAGSHIP = ROOT / "scenarios/1T-1024gpu.yaml"


def scenario(gpus: int):
    nodes = gpus // 16
    hidden = int(25600 * (gpus / 1024) ** 0.5) // 160 * 160  # Ψ grows with the GPUs
    return load_scenario(FLAGSHIP, [f"hardware.nodes={nodes}", f"parallel.dp={nodes}", f"model.global_batch={nodes}",
                                    f"model.hidden={hidden}"])


def main() -> None:
    full = "--full" in sys.argv
    print(f"{'GPUs':>7}{'mode':>10}{'events':>12}{'simulate s':>12}{'CPU s':>9}{'step s':>10}")
    for gpus in (64, 256, 1024, 4096, 16384):
        s = scenario(gpus)
        steps = {}
        for mode in ("class", "per_rank"):
            if mode == "per_rank" and gpus > 4096 and not full:
                continue
            start, cpu = time.perf_counter(), time.process_time()
            result = simulate(s, mode)
            seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
            steps[mode] = result.step_seconds[0]
            print(f"{gpus:>7}{mode:>10}{result.sim_events:>12,}{seconds:>12.2f}{cpu:>9.2f}{result.step_seconds[0]:>10.3f}",
                  flush=True)
        if len(steps) == 2:
            print(f"{'':>7}{'agree':>10}{'':>12}{'':>12}{'':>9}{steps['per_rank'] / steps['class'] - 1:>+10.2e}")
    start = time.perf_counter()
    from zsim.commands.collective import collective_table, sizes
    collective_table("dgx2", 1, 12, "all_reduce", sizes(8, 8 << 30, 2), 12)
    print(f"zsim collective, 31 sizes on 12 GPUs: {time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    main()

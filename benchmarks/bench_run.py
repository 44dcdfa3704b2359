"""Speed of `zsim run`: wall time and simpy events for the flagship and scaled variants.

Run: .venv/bin/python benchmarks/bench_run.py   (prints a table; not a timed test)
Target (issue: the spine): the 1T-1024gpu scenario simulates one step in under 2 s on 2 cores.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

from zsim.config.scenario import load_scenario
from zsim.engine.simulation import simulate

ROOT = Path(__file__).resolve().parents[1]
FLAGSHIP = ROOT / "scenarios/1T-1024gpu.yaml"


def simulate_seconds(overrides: list[str], repeat: int = 3) -> tuple[float, int]:
    times, events = [], 0
    for _ in range(repeat):
        scenario = load_scenario(FLAGSHIP, overrides)
        start = time.perf_counter()
        result = simulate(scenario)
        times.append(time.perf_counter() - start)
        events = result.sim_events
    return statistics.median(times), events


def kernel_list_seconds(repeat: int = 5) -> tuple[float, int, int]:
    """What the compute model costs the flagship: building and pricing every kernel list it uses from a
    cold cache (the engine then looks each price up per op): (seconds, lists, kernels)."""
    from zsim.compute.kernels import Shape, module_kernels, optimizer_kernels
    from zsim.compute.model import list_seconds
    from zsim.workload.transformer import padded_vocab

    s = load_scenario(FLAGSHIP)
    gpu, dtype = s.cluster.gpu, s.precision.dtype
    times = []
    for _ in range(repeat):
        module_kernels.cache_clear()
        optimizer_kernels.cache_clear()
        start = time.perf_counter()
        shape = Shape.of(s.model, s.layout.mp, padded_vocab(s.model.vocab, s.layout.mp), dtype)
        lists = [module_kernels(kind, phase, shape) for kind in ("embed", "block", "head")
                 for phase in ("fwd", "recompute", "bwd")]
        lists += list(optimizer_kernels(10**9, 100, dtype).values())
        for kl in lists:
            list_seconds(kl, gpu.compute, gpu.peak_flops[dtype], gpu.hbm_bytes_per_s, dtype)
        times.append(time.perf_counter() - start)
    unique = {id(kl): kl for kl in lists}.values()
    return statistics.median(times), len(unique), sum(len(kl.kernels) for kl in unique)


def main() -> None:
    seconds, lists, kernels = kernel_list_seconds()
    print(f"compute model: {lists} kernel lists ({kernels} kernels) built and priced in {seconds * 1e3:.2f} ms "
          "(once per run; each op then looks its price up)\n")
    print(f"{'case':<42}{'GPUs':>7}{'events':>10}{'simulate s':>12}")
    for nodes, steps in ((64, 1), (64, 10), (256, 1), (1024, 1)):
        overrides = [f"hardware.nodes={nodes}", f"parallel.dp={nodes}", f"run.steps={steps}",
                     f"model.global_batch={nodes}"]
        seconds, events = simulate_seconds(overrides)
        print(f"{f'1T, ZeRO-3, MP 16, {steps} step(s)':<42}{nodes * 16:>7}{events:>10,}{seconds:>12.3f}")
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "zsim.cli", "run", str(FLAGSHIP), "-o", "/tmp/zsim-bench"], check=True,
                   capture_output=True, cwd=ROOT)
    print(f"{'zsim run scenarios/1T-1024gpu.yaml (whole CLI)':<42}{1024:>7}{'':>10}{time.perf_counter() - start:>12.3f}")
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "zsim.cli", "run", str(FLAGSHIP), "-o", "/tmp/zsim-bench", "--no-plot"],
                   check=True, capture_output=True, cwd=ROOT)
    print(f"{'  the same with --no-plot':<42}{1024:>7}{'':>10}{time.perf_counter() - start:>12.3f}")


if __name__ == "__main__":
    main()

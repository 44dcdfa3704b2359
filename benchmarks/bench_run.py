"""Speed of `zsim run`: wall time and simpy events for the flagship and scaled variants.

Run: .venv/bin/python benchmarks/bench_run.py [--full]   (prints tables; not a timed test)
Targets: the 1T-1024gpu scenario simulates one step in under 2 s on 2 cores (issue: the spine); per-rank
mode at 1024 GPUs under 2 s and at 16,384 GPUs under 30 s; gradient accumulation 64 within 1.5× of 1
(issue 28); one pipeline, PTD-P's 145.6B on 1536 GPUs, every micro-batch of every stage simulated. The
machine is shared: compare the CPU seconds of rows of one run, not runs. `--full` adds
per-rank mode at 16,384 GPUs (a minute or more of CPU).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

from zsim.scenario.scenario import load_scenario
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


def timed(overrides: list[str], mode: str | None = None, repeat: bool = True) -> tuple[float, float, int, int]:
    """(wall s, CPU s, simpy events, micro-batches spliced rather than simulated) of one simulation of
    the flagship with `overrides` (`repeat`: simulate's, zsim.engine.repeat)."""
    scenario = load_scenario(FLAGSHIP, overrides)
    wall, cpu = time.perf_counter(), time.process_time()
    result = simulate(scenario, mode=mode, trace=False, repeat=repeat)
    return time.perf_counter() - wall, time.process_time() - cpu, result.sim_events, result.repeated_micro_batches


def per_rank_and_accumulation(full: bool) -> None:
    """Per-rank mode at 1024 GPUs (healthy, one slow NIC, one slow NVLink) and 16,384 (`full`), and the
    flagship's cost at gradient accumulation 1, 2, 4 and 64 (class mode, without trace events; 64 also
    with every micro-batch simulated, repeat=False)."""
    print(f"\n{'case':<50}{'GPUs':>7}{'events':>11}{'wall s':>9}{'CPU s':>9}")
    cases = [("per-rank, 1 step", [], 1024), ("per-rank, one NIC of node 2 at 25%",
              ["fabric.degrade=[{link: nic, node: 2, index: 5, factor: 0.25}]"], 1024),
             ("per-rank, GPU 37's NVLink at 50%", ["fabric.degrade=[{link: nvlink, gpu: 37, factor: 0.5}]"], 1024)]
    if full:
        cases.append(("per-rank, 1 step", ["hardware.nodes=1024", "parallel.dp=1024", "model.global_batch=1024"],
                      16384))
    for name, overrides, gpus in cases:
        wall, cpu, events, _ = timed(overrides, "per_rank")
        print(f"{name:<50}{gpus:>7}{events:>11,}{wall:>9.2f}{cpu:>9.2f}")
    # The least CPU time of 7 rounds, each running every case once in turn (as timeit reports: what the code
    # costs when nothing else on the shared machine gets in its way; a median of runs of ~0.1 s moved by
    # ±20% between runs of this benchmark); every micro-batch simulated once (~5-7 s).
    cases = [(1, True), (2, True), (4, True), (64, True)]
    rounds = [[timed([f"model.global_batch={64 * accum}"], "class", repeat) for accum, repeat in cases]
              for _ in range(7)]
    rows = [min((r[k] for r in rounds), key=lambda r: r[1]) for k in range(len(cases))]
    rows.append(timed(["model.global_batch=4096"], "class", False))
    base = rows[0][1]
    for (accum, repeat), (wall, cpu, events, spliced) in zip(cases + [(64, False)], rows):
        how = f", {spliced} spliced" if spliced else "" if repeat else ", all simulated"
        name = f"class, grad_accum {accum}{how} (CPU ×{cpu / base:.2f} of 1)"
        print(f"{name:<50}{1024:>7}{events:>11,}{wall:>9.2f}{cpu:>9.2f}")


def kernel_list_seconds(repeat: int = 5) -> tuple[float, int, int]:
    """What the compute model costs the flagship: building and pricing every kernel list it uses from a
    cold cache (the engine then looks each price up per op): (seconds, lists, kernels)."""
    from zsim.compute.kernel_shape import Shape
    from zsim.compute.kernels import module_kernels
    from zsim.compute.optimizer_kernels import optimizer_kernels
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
    pipeline = load_scenario(ROOT / "scenarios/megatron/ptdp-145.6B-1536gpu.yaml")
    start = time.perf_counter()
    result = simulate(pipeline, trace=False)  # every micro-batch of every stage (no splice for pipelines)
    print(f"{'PTD-P 145.6B, PP 8 interleaved, m 24':<42}{1536:>7}{result.sim_events:>10,}"
          f"{time.perf_counter() - start:>12.3f}")
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "zsim.cli", "run", str(FLAGSHIP), "-o", "/tmp/zsim-bench"], check=True,
                   capture_output=True, cwd=ROOT)
    print(f"{'zsim run scenarios/1T-1024gpu.yaml (whole CLI)':<42}{1024:>7}{'':>10}{time.perf_counter() - start:>12.3f}")
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "zsim.cli", "run", str(FLAGSHIP), "-o", "/tmp/zsim-bench", "--no-plot"],
                   check=True, capture_output=True, cwd=ROOT)
    print(f"{'  the same with --no-plot':<42}{1024:>7}{'':>10}{time.perf_counter() - start:>12.3f}")
    per_rank_and_accumulation("--full" in sys.argv[1:])


if __name__ == "__main__":
    main()

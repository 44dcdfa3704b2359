"""Bit-exact fingerprints of whole simulations, recorded before the engine's speed work (issue 28, part 6).

Every number a Result carries but the simulator's own statistics (events scheduled, wall time) is hashed
from its exact repr: step times, communication stats, compute and offload seconds, the memory ledger's
timeline, peaks and OOM, the allocator's step states and the trace events. tests/test_engine_bits.py
asserts that today's engine gives the same hashes. Regenerate only deliberately, from an engine whose
results are meant to change: python -m tests.golden.engine_bits [CASE ...] (from the one-process-per-rank
reference path, so the rank classes are still checked against it). Regenerated 2026-11-26 after the
inter-node terms were fitted (issue 24) and the compute model gained sustained clocks (issue 25), and again
after the EDR terms were refit under NCCL 2.8's own tuner (issue 24, zsim/fabric/nccl_28.py), and after
InfiniBand's efficiency was held at its published 0.96 (zsim.calibrate.net_terms.IB_EFFICIENCY). On
2026-11-27 ten small cases again: the head's forward now takes the loss's copies of the logits before what
the loss saves (program order), which moves blocks in the allocator's states and nothing else (step times,
peaks and the flagship's cases unchanged; mp16-per_rank-stage2-ga2-2steps's ledger and trace too). Later on
2026-11-27 all cases: the tree's pipeline fill was priced (zsim.fabric.tree_chunks) and the EDR terms refit with it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from zsim.scenario.scenario import load_scenario
from zsim.engine.result import Result
from zsim.engine.simulation import simulate

ROOT = Path(__file__).resolve().parents[2]
FILE = Path(__file__).with_name("engine_bits.json")
FLAGSHIP = "scenarios/1T-1024gpu.yaml"
SMALL = "scenarios/paper/7.5B-64gpu-stage3.yaml"
SLOW_NIC = "fabric.degrade=[{link: nic, node: 2, index: 5, factor: 0.25}]"
SLOW_GPU_LINK = "fabric.degrade=[{link: nvlink, gpu: 37, factor: 0.5}]"
FOUR_NODES = ("model.layers=4", "hardware.nodes=4", "parallel.dp=4", "model.global_batch=4")  # the flagship's MP 16

# name -> (scenario file, --set overrides, mode); `slow` ones take seconds to minutes (per-rank at 1024 GPUs)
CASES: dict[str, tuple[str, tuple[str, ...], str]] = {
    "flagship-class-ga1": (FLAGSHIP, (), "class"),
    "flagship-class-ga4": (FLAGSHIP, ("model.global_batch=256",), "class"),
    "flagship-class-ga64": (FLAGSHIP, ("model.global_batch=4096",), "class"),
    "flagship-class-ga4-2steps": (FLAGSHIP, ("model.global_batch=256", "run.steps=2"), "class"),
    "small-class-stage1-ga4": (SMALL, ("zero.stage=1", "model.global_batch=1024"), "class"),
    "small-class-stage2-ga4": (SMALL, ("zero.stage=2", "model.global_batch=1024"), "class"),
    "small-per_rank-stage0": (SMALL, ("zero.stage=0", "model.layers=6"), "per_rank"),
    "small-per_rank-stage1": (SMALL, ("zero.stage=1",), "per_rank"),
    "small-per_rank-stage2": (SMALL, ("zero.stage=2",), "per_rank"),
    "small-per_rank-stage3": (SMALL, (), "per_rank"),
    "small-per_rank-slow-nic-ga4": (SMALL, (SLOW_NIC, "model.global_batch=1024"), "per_rank"),
    "small-per_rank-slow-gpu-link": (SMALL, (SLOW_GPU_LINK,), "per_rank"),
    "small-per_rank-slow-gpu-link-stage2-ga4": (SMALL, (SLOW_GPU_LINK, "zero.stage=2", "model.global_batch=1024"),
                                                "per_rank"),
    "small-per_rank-hierarchical": (SMALL, ("fabric.algorithm=hierarchical", "zero.stage=2"), "per_rank"),
    "mp16-per_rank-slow-gpu-link-ga2": (FLAGSHIP, FOUR_NODES + ("model.global_batch=8", SLOW_GPU_LINK), "per_rank"),
    "mp16-per_rank-slow-nic-2steps": (FLAGSHIP, FOUR_NODES + ("run.steps=2", SLOW_NIC), "per_rank"),
    "mp16-per_rank-stage2-ga2-2steps": (FLAGSHIP, FOUR_NODES + ("zero.stage=2", "model.hidden=2560", "model.heads=16",
                                                               "model.global_batch=8", "run.steps=2"), "per_rank"),
    "host-per_rank": ("scenarios/host/tiny-2rank-stage3.yaml", (), "per_rank"),
    "flagship-per_rank": (FLAGSHIP, (), "per_rank"),
    "flagship-per_rank-slow-nic": (FLAGSHIP, (SLOW_NIC,), "per_rank"),
    "flagship-per_rank-slow-gpu-link": (FLAGSHIP, (SLOW_GPU_LINK,), "per_rank"),
    "flagship-per_rank-ga4-2steps": (FLAGSHIP, ("model.global_batch=256", "run.steps=2"), "per_rank"),
}
SLOW = {name for name in CASES if name.startswith("flagship-per_rank")}
LONG = {"flagship-per_rank-ga4-2steps"}  # minutes: tests/test_engine_bits.py runs it only when asked


def _digest(value: object) -> str:
    return hashlib.sha256(repr(value).encode()).hexdigest()[:20]


def _ledger(ledger) -> object:
    if ledger is None:
        return None
    times, totals = ledger.timeline()
    return (times.tobytes(), totals.tobytes(), ledger.reserved_timeline().tobytes(), ledger.peak, ledger.peak_time,
            ledger.peak_by_category, ledger.peak_reserved, ledger.peak_reserved_time, repr(ledger.oom))


def fingerprint(result: Result) -> dict[str, str]:
    """Hashes of each part of `result` (exact reprs: equal hashes mean equal bits), and the step times."""
    return {
        "step_seconds": repr(result.step_seconds),
        "timing": _digest((result.step_seconds, result.compute_seconds, result.mp_comm_seconds,
                           result.hardware_flops, result.model_flops, result.offload_seconds)),
        "comm": _digest(sorted(result.comm.items())),
        "algorithms": _digest(sorted(result.algorithms.items())),
        "ledger": _digest(_ledger(result.ledger)),
        "host_ledger": _digest(_ledger(result.host_ledger)),
        "step_memory_states": _digest(result.step_memory_states),
        "events": _digest(json.dumps(result.events, sort_keys=True)),
        "mode": result.mode,
    }


def run_case(name: str, rank_classes: bool = True) -> dict[str, str]:
    """The fingerprint of case `name`; `rank_classes=False` runs per-rank mode one process per rank, the
    reference the goldens are regenerated from when the model's results are meant to change. Every
    micro-batch is simulated (repeat=False): a spliced step (zsim.engine.repeat) equals it to round-off,
    not to the bit, and is checked against it in tests/test_repeat.py."""
    path, overrides, mode = CASES[name]
    return fingerprint(simulate(load_scenario(ROOT / path, list(overrides)), mode=mode, rank_classes=rank_classes,
                                repeat=False))


def main() -> None:
    import sys
    import time

    names = sys.argv[1:] or list(CASES)
    known = json.loads(FILE.read_text()) if FILE.exists() else {}
    for name in names:
        start = time.perf_counter()
        known[name] = run_case(name, rank_classes=False)
        print(f"{name}: {time.perf_counter() - start:.2f} s {known[name]['step_seconds']}", flush=True)
    FILE.write_text(json.dumps(known, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()

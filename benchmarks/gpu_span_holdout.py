"""The GPU phase fit on the H200 device-check runs (data/device/20261126-h200): fitted on the h1024
(stage 1) and h4096 (stage 2, checkpointing) runs, judged on the h2048 stage-3 run it never saw (chosen
held out before any data existed, docs/device-check.md). docs/calibrate.md quotes these figures.

    .venv/bin/python benchmarks/gpu_span_holdout.py [--profile hgx-h200]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from zsim.calibrate.gpu_phase_fit import heldout_run, kineto_heldout
from zsim.calibrate.span_timing import combination, span_samples
from zsim.fabric.cluster import load_cluster
from zsim.trace.run_reader import read_run

RUNS = Path(__file__).resolve().parents[1] / "data" / "device" / "20261126-h200" / "runs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="hgx-h200", help="base system profile")
    args = parser.parse_args()
    if not RUNS.is_dir():
        print(f"no device-check data in {RUNS}")
        return
    runs = {name: read_run(RUNS / name) for name in ("h1024", "h4096", "h2048")}
    cluster = load_cluster(args.profile, 1)
    peak = cluster.gpu.peak_flops["bf16"]
    for name, run in runs.items():
        shown = combination(span_samples(run, args.profile), peak)
        print(f"{name}: of {shown['spans']} spans, {shown['unexplained_by_sum']} shorter than host time + FLOPs at "
              f"peak, {shown['unexplained_by_max']} shorter than the larger of the two: {shown['combination']}(device, host)")
    show("host spans (CUDA events)", heldout_run(cluster, [runs["h1024"], runs["h4096"]], runs["h2048"], args.profile))
    names = ("h1024-kineto", "h4096-kineto", "h2048-kineto")  # the same shapes timed by their GPU kernels (Kineto)
    if all((RUNS / n).is_dir() for n in names):
        kineto = [read_run(RUNS / n) for n in names]
        show("GPU kernel times (Kineto)", kineto_heldout(cluster, kineto[:2], kineto[2], args.profile))


def show(timing: str, report: dict) -> None:
    """A held-out split of zsim.calibrate.gpu_phase_fit (heldout_run, kineto_heldout): the fit, then h2048's errors."""
    s = report["summary"]
    print(f"{timing}, fitted on h1024 + h4096:", {k: round(v, 4) for k, v in report["fit"].items()})
    print(f"  in sample: median {s['median_error']:.1%}, worst {s['max_error']:.1%}; "
          f"on bounds: {', '.join(s.get('at_bounds', [])) or 'none'}")
    print(f"  held out h2048 (stage 3), {report['ops']} ops: median |error| {report['median_error']:.1%}, "
          f"worst {report['max_error']:.1%}, sum of the ops {report['total_error']:+.1%}")
    print("  missed most:", "; ".join(report["worst_ops"]))


if __name__ == "__main__":
    main()

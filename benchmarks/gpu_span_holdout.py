"""The GPU phase fit on the H200 device-check runs (data/device/20261126-h200): fitted on the h1024
(stage 1) and h4096 (stage 2, checkpointing) runs, judged on the h2048 stage-3 run it never saw (chosen
held out before any data existed, docs/device-check.md). docs/calibrate.md quotes these figures.

    .venv/bin/python benchmarks/gpu_span_holdout.py [--profile hgx-h200]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from zsim.calibrate.gpu_phase_fit import heldout_run
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
    report = heldout_run(cluster, [runs["h1024"], runs["h4096"]], runs["h2048"], args.profile)
    s = report["summary"]
    print("fitted on h1024 + h4096:", {k: round(v, 4) for k, v in report["fit"].items()})
    print(f"  in sample: median {s['median_error']:.1%}, worst {s['max_error']:.1%}; "
          f"on bounds: {', '.join(s.get('at_bounds', [])) or 'none'}; spans {s['spans']}")
    print(f"held out h2048 (stage 3), {report['ops']} ops: median |error| {report['median_error']:.1%}, "
          f"worst {report['max_error']:.1%}, sum of the ops {report['total_error']:+.1%}")
    print("  missed most:", "; ".join(report["worst_ops"]))
    kineto_holdout(cluster, args.profile)


def kineto_holdout(cluster, profile: str) -> None:
    """The same split timed by the runs' GPU kernels (Kineto, the `-kineto` runs): fitted on h1024 and h4096,
    judged per op on h2048, whose kernels the fit never saw."""
    import numpy as np

    from zsim.calibrate.gpu_phase_fit import _predict, calibrate_phases, op_row
    from zsim.calibrate.kineto_compute import gpu_aligned_ops, read_labelled

    names = ("h1024-kineto", "h4096-kineto", "h2048-kineto")
    if not all((RUNS / n).is_dir() for n in names):
        return
    train, test = [read_run(RUNS / n) for n in names[:2]], read_run(RUNS / names[2])
    pf = calibrate_phases(cluster, train, profile)
    print("Kineto (GPU kernel times), fitted on h1024 + h4096:", {k: round(v, 4) for k, v in pf.values.items()},
          f"in sample: median {pf.median_error:.1%}, worst {pf.max_error:.1%}; on bounds: {', '.join(pf.at_bounds) or 'none'}")
    terms, peak, hbm = cluster.gpu.compute, cluster.gpu.peak_flops["bf16"], cluster.gpu.hbm_bytes_per_s
    pairs = gpu_aligned_ops(test, read_labelled(test.folder), profile)
    rows = [op_row(op, s, terms, peak, hbm, "bf16", "held out") for op, s in pairs]
    p = np.array([pf.values["kernel_us"] * 1e-6, pf.values["reduce_kernel_us"] * 1e-6, 1.0 / (hbm * pf.values["hbm_efficiency"])])
    predicted, measured = _predict(rows, p), np.array([r.seconds for r in rows])
    errors = predicted / measured - 1.0
    print(f"  held out h2048 (stage 3), {len(rows)} ops: median |error| {np.median(np.abs(errors)):.1%}, "
          f"worst {np.max(np.abs(errors)):.1%}, sum of the ops {predicted.sum() / measured.sum() - 1:+.1%}")
    by: dict[str, list[float]] = {}
    for (op, _), e in zip(pairs, errors):
        by.setdefault(op.name.rsplit(".", 1)[0] if ".layer" in op.name or "/layer" in op.name else op.name, []).append(e)
    print("  by op:", "; ".join(f"{k} {np.median(v):+.0%}" for k, v in by.items()))


if __name__ == "__main__":
    main()

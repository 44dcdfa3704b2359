"""Print what the device-check data (data/device/) say: memory peaks measured against zsim's allocator,
the ledger against what setup allocated, the flush price, GPU busy share per step, the GEMM model on
the GPT shapes it never saw, and zsim's FlashAttention rates against the measured kernels.
docs/device-check.md quotes these figures.

    .venv/bin/python benchmarks/device_report.py [--profile hgx-h200] [--gpu h200-sxm-141gb]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from zsim.calibrate import device_report as dr

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="hgx-h200", help="system profile to simulate on")
    parser.add_argument("--gpu", default="h200-sxm-141gb", help="GPU profile for the GEMM fit")
    args = parser.parse_args()
    runs = dr.device_runs(ROOT / "data" / "device")
    if not runs:
        print("no device-check data in data/device/ (make device-check on a GPU)")
        return
    for run in runs:
        print(f"== {run.folder.name}: {run.gpu}, torch {run.manifest['provenance']['torch']}")
        shapes = [k for k in run.parts if k.startswith("h") and not k.endswith("-kineto")]
        for shape in shapes:
            m = dr.measured_memory(run, shape)
            s = dr.simulated_memory(run, shape, args.profile)
            busy = dr.gpu_busy_share(run, shape)
            print(f"  {shape}: allocated peak {m['allocated_peak'] / 1e9:.2f} GB (zsim {s['allocated_peak'] / 1e9:.2f}, "
                  f"{s['allocated_peak'] / m['allocated_peak'] - 1:+.1%}), reserved {m['reserved_peak'] / 1e9:.2f} GB "
                  f"(zsim {s['reserved_peak'] / 1e9:.2f}, {s['reserved_peak'] / m['reserved_peak'] - 1:+.1%}); "
                  f"setup beyond the ledger {m['setup_allocated'] - m['ledger_model_states']:,} B; "
                  f"GPU busy {min(busy):.0%}-{max(busy):.0%} of a step")
        if any(k.startswith("flush-") for k in run.parts):
            price = dr.flush_price(run)
            for row in price["runs"]:
                step = f"{row['median_step_ms']:.1f} ms" if row["median_step_ms"] else "-"
                print(f"  {row['part']}: cap {row['cap_gib']:.2f} GiB, exit {row['exit']}, "
                      f"retries/step {row['retries_per_step']}, median step {step}")
            print(f"  flush-and-retry: {price['ms_per_retry']:.2f} ms ({price['runs_with_retries']} run(s) against "
                  f"{price['controls']} capped control(s))")
        for row in dr.attention_errors(run):
            mask = "causal" if row["causal"] else "full mask"
            errors = " ".join(f"{s}:{e:+.0%}" for s, e in sorted(row["errors"].items()))
            print(f"  attention {row['backend']} {row['pass']} {mask}, head dim {row['head_dim']}: zsim/measured - 1 {errors}")
        for row in dr.causal_ratio_errors(run):
            errors = " ".join(f"{s}:{e:+.1%}{' (fit)' if s in row['fitted'] else ''}" for s, e in row["errors"].items())
            print(f"  causal/full backward ratio {row['backend']}, head dim {row['head_dim']}: zsim/measured - 1 {errors}")
        if run.folder.name.endswith("-gemm"):
            for dtype in ("bf16", "fp16"):
                g = dr.gemm_holdout(run, dtype, args.gpu, with_2fold=True)
                print(f"  GEMM {dtype}: fitted on {g['train_rows']} DeepBench rows, {g['test_rows']} GPT rows held out: "
                      f"median |error| {g['heldout_median_abs']:.1%}, worst {g['heldout_max_abs']:.1%}; all rows 2-fold "
                      f"median {g['all_rows_2fold_median']:.1%}")


if __name__ == "__main__":
    main()

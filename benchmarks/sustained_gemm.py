"""Sustained vs short-burst GEMM rate on one CUDA GPU: the evidence for a GPU profile's
`sustained_ratio` (docs/compute.md, "Sustained clocks").

Runs XLA's largest table shape (b 4, m = n = k = 4096, bf16, randn operands; ../shared/data/gemm-xla/)
after 5 s idle: one warm-up, then 5 GEMMs timed as XLA's table generator times them (median of 5,
flipping between two operand sets), then back to back for `--seconds`, each timed with CUDA events.
Run beside `nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,
clocks_throttle_reasons.active --format=csv,noheader,nounits -lms 200 > smi.csv` for the clock log.
Writes `gemm.csv` (t_s, ms, tflops) and `summary.json` under `--out`; prints the summary.
data/device/20261126-h200-sustained holds its run on the lent H200 (the same code, sent inline).
Exit 2 without a CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seconds", type=float, default=100.0)
    args = p.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("no CUDA GPU", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    b, n = 4, 4096
    flops = 2.0 * b * n ** 3
    gen = torch.Generator(device="cuda").manual_seed(0)
    ops = [tuple(torch.randn(b, n, n, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
           for _ in range(2)]
    time.sleep(5.0)  # idle first: the GPU starts cool, as a table generator's short run does

    def one(i: int) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a, c = ops[i % 2]  # flip between operand sets, as XLA's generator does
        start.record()
        torch.bmm(a, c)
        end.record()
        end.synchronize()
        return start.elapsed_time(end)  # ms

    one(0)
    burst = [one(i) for i in range(5)]
    t0, rows, i = time.time(), [], 0
    while time.time() - t0 < args.seconds:
        ms = one(i)
        i += 1
        rows.append((time.time() - t0, ms, flops / ms / 1e9))
    (args.out / "gemm.csv").write_text("t_s,ms,tflops\n" + "".join(f"{t:.3f},{m:.4f},{x:.1f}\n" for t, m, x in rows))
    burst_tflops = flops / statistics.median(burst) / 1e9

    def window(lo: float, hi: float) -> float:
        return statistics.median(r[2] for r in rows if lo <= r[0] < hi)

    last = args.seconds - 30
    summary = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "shape": [b, n, n, n],
               "burst_median_tflops": burst_tflops, "s0_1": window(0, 1), "s1_5": window(1, 5),
               "s5_20": window(5, 20), "s20_40": window(20, 40), "s40_70": window(40, 70),
               "s70_100": window(last, args.seconds), "ratio_last30_to_burst": window(last, args.seconds) / burst_tflops,
               "gemms": len(rows)}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

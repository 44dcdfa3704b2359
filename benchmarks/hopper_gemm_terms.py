"""The Hopper GEMM terms against PyTorch's GEMMs measured on an H200 (data/device/20261126-h200-gemm): the
figure docs/compute.md ("A known gap in the H100's burst rate") quotes. For each profile, the median and
range of zsim's rate / the measured rate over the table's large shapes (>= 5e10 FLOPs, measured above
300 TFLOPS: the slow transposed layouts left out), and over its GPT-layer rows.

Run: .venv/bin/python benchmarks/hopper_gemm_terms.py [--terms xla]   (prints a table; a second)
`--terms xla` prices with the H100's former bf16 terms, its fit to XLA's sm_90 table (docs/compute.md).
"""

from __future__ import annotations

import csv
import dataclasses
import statistics
import sys
from pathlib import Path

from zsim.compute.gemm import gemm_seconds
from zsim.compute.terms import GemmTerms
from zsim.fabric.cluster import load_cluster

TABLE = Path(__file__).resolve().parents[1] / "data" / "device" / "20261126-h200-gemm" / "gemm_bf16.csv"
# hwprofiles/gpus/h100-sxm5-80gb.yaml's bf16 terms until 2026-11-27 (its comment keeps them)
XLA_BF16 = dict(efficiency=0.8763, tile_bytes_per_s=43.1216e12, k_overhead=153.0, fixed_s=5.557e-6,
                hbm_efficiency=0.9430)


def ratios(profile: str, terms: GemmTerms | None = None) -> tuple[list[float], list[float]]:
    """zsim rate / measured rate for the table's large rows, and for its GPT rows."""
    gpu = load_cluster(profile, 1).gpu
    g = terms or gpu.compute.gemm_terms("bf16")
    every, gpt = [], []
    with TABLE.open() as f:
        for row in csv.DictReader(f):
            m, n, k = int(row["M"]), int(row["N"]), int(row["K"])
            if 2 * m * n * k < 5e10 or float(row["tflops"]) < 300:
                continue
            t = gemm_seconds(m, n, k, 1, 2, g, gpu.compute.sms, gpu.compute.tiles, gpu.peak_flops["bf16"],
                             gpu.hbm_bytes_per_s)
            r = float(row["time_ms"]) * 1e-3 / t
            every.append(r)
            if row["source"].startswith("GPT"):
                gpt.append(r)
    return every, gpt


def main() -> None:
    if not TABLE.is_file():
        print(f"no device table at {TABLE}")
        return
    xla = "--terms" in sys.argv and sys.argv[-1] == "xla"
    print(f"{'profile (bf16 terms)':<34}{'rows':>5}{'median':>8}{'range':>16}{'GPT rows':>9}{'median':>8}")
    for profile in ("hgx-h100-ndr", "hgx-h200"):
        terms = None
        if xla and profile == "hgx-h100-ndr":
            terms = dataclasses.replace(load_cluster(profile, 1).gpu.compute.gemm_terms("bf16"), **XLA_BF16)
        every, gpt = ratios(profile, terms)
        name = f"{profile} ({'XLA sm_90 fit' if terms else 'shipped'})"
        print(f"{name:<34}{len(every):>5}{statistics.median(every):>8.3f}"
              f"{f'{min(every):.3f}-{max(every):.3f}':>16}{len(gpt):>9}{statistics.median(gpt):>8.3f}")


if __name__ == "__main__":
    main()

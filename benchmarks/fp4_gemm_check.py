"""The Blackwell NVFP4 GEMM terms (`gemm.fp4`; docs/compute.md "NVFP4 GEMMs") against the one published FP4 GEMM
table of a B200 found (data/published/gemm-fp4/, SOURCE.md there: DeepGEMM PR #348, MXFP4, cuBLAS 13.3 beside the
PR's kernel), and the fit that sets them.

The table has seven shapes, too few for the five-term fit of `zsim gemm-fit`: one term is fitted, `efficiency`
(the share of the FP4 peak a large tile sustains), by least squares on log(time) to the cuBLAS column's rows with
M >= 4096 (a training micro-batch's tokens; the five rows of M 128-1024 are inference shapes, bound by terms this
table is too small to fit), the other four terms held at the B200's bf16 fit. Chosen before the fitted terms were
run on any training point. Printed: each row's error with the terms carried over from bf16 (before) and fitted
(after), the fit of each training row predicting the other (held out), and the PR kernel's column beside.
Errors are zsim's time over the table's, less 1 (negative: zsim faster), at the burst rate (no sustained_ratio: a
GEMM table is a short burst). Run: `.venv/bin/python benchmarks/fp4_gemm_check.py`.
"""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

from zsim.calibrate.gemm_fit import GemmHardware, GemmRow, fit_efficiency, predict
from zsim.fabric.cluster import load_cluster

TABLE = Path(__file__).resolve().parents[1] / "data" / "published" / "gemm-fp4" / "deepgemm-pr348-b200-mxfp4.csv"
TRAINING_M = 4096  # rows with at least this many tokens (M) are what the efficiency is fitted to


def rows(column: str = "cublas_tflops") -> list[GemmRow]:
    """The table's rows, seconds from `column`'s TFLOPS (2·M·N·K / time)."""
    with TABLE.open(newline="") as fh:
        return [GemmRow(int(r["m"]), int(r["n"]), int(r["k"]), 1,
                        2 * int(r["m"]) * int(r["n"]) * int(r["k"]) / (float(r[column]) * 1e12))
                for r in csv.DictReader(fh)]


def b200() -> tuple[GemmHardware, object]:
    """The B200's FP4 hardware (half-byte operands at the FP4 peak) and its bf16 GEMM terms."""
    gpu = load_cluster("dgx-b200", 1).gpu
    c = gpu.compute
    return GemmHardware(c.sms, c.tiles, gpu.peak_flops["fp4"], gpu.hbm_bytes_per_s, 0.5), c.gemm["bf16"]


def fitted() -> float:
    """`efficiency` fitted to the cuBLAS rows with M >= TRAINING_M (the module docstring)."""
    hw, bf16 = b200()
    return fit_efficiency([r for r in rows() if r.m >= TRAINING_M], hw, bf16)


def main() -> None:
    hw, bf16 = b200()
    cublas, deepgemm = rows(), rows("deepgemm_tflops")
    train = [r for r in cublas if r.m >= TRAINING_M]
    e = fit_efficiency(train, hw, bf16)
    after = dataclasses.replace(bf16, efficiency=e)
    profile = load_cluster("dgx-b200", 1).gpu.compute.gemm["fp4"]
    print(f"efficiency fitted to the {len(train)} cuBLAS rows with M >= {TRAINING_M}: {e:.4f} "
          f"(bf16's, carried before: {bf16.efficiency:.4f}; the profile's now: {profile.efficiency:.4f})")
    print(f"{'M x N x K':>18s} {'cuBLAS TF':>9s} {'carried':>8s} {'fitted':>8s} {'DG TF':>6s} {'DG fitted':>9s}")
    for c, d in zip(cublas, deepgemm):
        print(f"{c.m:>6d}x{c.n}x{c.k:<6d} {2 * c.m * c.n * c.k / c.seconds / 1e12:9.0f} "
              f"{predict(c, bf16, hw) / c.seconds - 1:+8.1%} {predict(c, after, hw) / c.seconds - 1:+8.1%} "
              f"{2 * d.m * d.n * d.k / d.seconds / 1e12:6.0f} {predict(d, after, hw) / d.seconds - 1:+9.1%}")
    for i, held in enumerate(train):  # each training row predicted by a fit of the others
        e_i = fit_efficiency(train[:i] + train[i + 1:], hw, bf16)
        err = predict(held, dataclasses.replace(bf16, efficiency=e_i), hw) / held.seconds - 1
        print(f"held out {held.m}x{held.n}x{held.k}: fitted on the other row(s) efficiency {e_i:.4f}, error {err:+.1%}")


if __name__ == "__main__":
    main()

"""How well the GPU profiles' FP8 GEMM terms (`compute.gemm.fp8`: the bf16 terms carried over at the FP8 peak,
precision.fp8; docs/compute.md "FP8 GEMMs") predict published FP8 GEMM tables they were never fitted to
(data/published/gemm-fp8/, SOURCE.md there):

- B200: XLA's sm_100 FP8 rows (375 shapes per operand pair);
- H100-class (H800 SXM, the same SMs, clocks and FP8 peak as H100 SXM): TileLang's FP8 GEMMs at 8192 x 8192 x K,
  and DeepGEMM's and its CUTLASS 3.6 baseline's dense FP8 GEMMs (block-scaled: DeepSeek-V3's recipe, more work
  than a per-tensor-scaled GEMM);
- XLA's sm_90 FP8 rows, which SOURCE.md calls implausible (87 of 1125 above the FP8 peak): printed, not trusted.

Errors are zsim's time over the table's, less 1 (negative: zsim faster), at the burst rate (sustained_ratio not
applied: the tables are short bursts). Last, the share of a block's compute (forward and backward) that its quantize
and amax passes take in the shipped FP8 scenario (scenarios/llama-3-70b-fp8-dgx-h100.yaml, TP 4: docs/models.md, "FP8
training"). Run: `.venv/bin/python benchmarks/fp8_gemm_check.py`.
"""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

from zsim.compute.gemm import gemm_seconds
from zsim.fabric.cluster import load_cluster

DATA = Path(__file__).resolve().parents[1] / "data" / "published" / "gemm-fp8"


def errors(rows: list[tuple[int, int, int, int, float]], profile: str) -> list[float]:
    """zsim's time / the table's − 1 for each (m, n, k, batch, seconds) row on system `profile`'s GPU, its fp8 terms."""
    gpu = load_cluster(profile, 1).gpu
    c = gpu.compute
    return [gemm_seconds(m, n, k, b, 1, c.gemm["fp8"], c.sms, c.tiles, gpu.peak_flops["fp8"], gpu.hbm_bytes_per_s) / t - 1
            for m, n, k, b, t in rows]


def xla_rows(name: str, dtype: str = "f8e4m3fnxf8e4m3fn->bf16") -> list[tuple[int, int, int, int, float]]:
    out = []
    with (DATA / name).open(newline="") as fh:
        for r in csv.DictReader(fh):
            if r["dtype"] == dtype:
                b, m, n, k = (int(r[c]) for c in ("b", "m", "n", "k"))
                out.append((m, n, k, b, 2 * b * m * n * k / float(r["flops_per_s"])))
    return out


def tilelang_rows(version: str = "v2", min_k: int = 0) -> list[tuple[int, int, int, int, float]]:
    with (DATA / "tilelang-h800-fp8.csv").open(newline="") as fh:
        return [(int(r["m"]), int(r["n"]), int(r["k"]), 1, float(r["latency_ms"]) * 1e-3)
                for r in csv.DictReader(fh) if r["version"] == version and int(r["k"]) >= min_k]


def deepgemm_rows(column: str = "deepgemm_tflops") -> list[tuple[int, int, int, int, float]]:
    with (DATA / "deepgemm-h800.csv").open(newline="") as fh:
        return [(int(r["m"]), int(r["n"]), int(r["k"]), 1, 2 * int(r["m"]) * int(r["n"]) * int(r["k"]) / (float(r[column]) * 1e12))
                for r in csv.DictReader(fh) if r["kind"] == "dense"]


def line(label: str, errs: list[float]) -> str:
    a = sorted(abs(e) for e in errs)
    return (f"{label:58s} n={len(errs):4d}  median |err| {statistics.median(a):5.1%}  signed {statistics.median(errs):+6.1%}"
            f"  p90 {a[int(0.9 * (len(a) - 1))]:5.1%}")


def quantize_share(path: Path) -> float:
    """The quantize and amax kernels' share of one block's forward and backward GPU time in scenario `path`."""
    from zsim.compute.kernels import module_kernels
    from zsim.compute.model import kernel_seconds
    from zsim.scenario.scenario import load_scenario
    from zsim.compute.kernel_shape import Shape

    s = load_scenario(path)
    gpu = s.cluster.gpu
    shape = Shape.of(s.model, s.layout.mp, 0, s.precision.dtype, arch=gpu.compute_capability,
                     sp=s.parallel.sequence_parallel, fp8=s.precision.fp8)
    total = quantize = 0.0
    for phase in ("fwd", "bwd"):
        for k in module_kernels("block", phase, shape).kernels:
            t = kernel_seconds(k, gpu.compute, gpu.peak_flops[s.precision.dtype], gpu.hbm_bytes_per_s, s.precision.dtype,
                               2, gpu.peak_flops["fp8"])
            total += t
            quantize += t if k.name.endswith((".quantize", ".amax")) else 0.0
    return quantize / total


def main() -> None:
    print(line("B200: XLA sm_100 FP8 (E4M3 x E4M3)", errors(xla_rows("xla-sm_100-fp8.csv"), "gcp-a4-b200")))
    print(line("B200: XLA sm_100 FP8 (E4M3 x E5M2)", errors(xla_rows("xla-sm_100-fp8.csv", "f8e4m3fnxf8e5m2->bf16"),
                                                          "gcp-a4-b200")))
    print(line("H800: TileLang v2, 8192 x 8192 x K, K >= 2048", errors(tilelang_rows("v2", 2048), "dgx-h100")))
    print(line("H800: TileLang v2, every K (256-16384)", errors(tilelang_rows("v2"), "dgx-h100")))
    print(line("H800: DeepGEMM dense (block-scaled)", errors(deepgemm_rows(), "dgx-h100")))
    print(line("H800: CUTLASS 3.6 dense (DeepGEMM's baseline, block-scaled)", errors(deepgemm_rows("cutlass_tflops"), "dgx-h100")))
    print(line("H100: XLA sm_90 FP8 (implausible: above peak; not trusted)", errors(xla_rows("xla-sm_90-fp8.csv"), "dgx-h100")))
    scenario = DATA.parents[2] / "scenarios" / "llama-3-70b-fp8-dgx-h100.yaml"
    print(f"quantize and amax passes, share of a block's compute in {scenario.name}: {quantize_share(scenario):.1%}")


if __name__ == "__main__":
    main()

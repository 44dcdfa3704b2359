"""Where a transformer layer's time goes in zsim's compute model, for the runs docs/validation.md
discusses, and the DeepBench fit's error by GEMM size: the figures behind its "what is still missing"
and Megatron-LM strong-scaling paragraphs.

Run: .venv/bin/python benchmarks/compute_breakdown.py   (prints two tables; the second needs
../shared/data/deepbench-v100 and is skipped without it)

Per layer, one MP rank, forward twice (the forward and the recompute) and backward once: the GEMMs'
seconds and TFLOPS, and the memory-bound kernels' seconds and share of the layer.
"""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

from zsim.compute.gemm import gemm_seconds
from zsim.compute.kernel_shape import Shape
from zsim.compute.kernels import block_backward, block_forward
from zsim.compute.model import kernel_seconds
from zsim.fabric.cluster import load_cluster

ROOT = Path(__file__).resolve().parents[1]
DEEPBENCH = ROOT.parent / "shared" / "data" / "deepbench-v100" / "gemm_fp16_tensorcore.csv"
# name: (hidden, heads, micro-batch, MP) as the scenarios run them (scenarios/paper, scenarios/megatron)
RUNS = {
    "ZeRO 40B (fig2-zero-40B)": (6144, 32, 12, 4),
    "ZeRO 20B (fig2-zero-20B)": (4096, 32, 32, 4),
    "ZeRO 100B (fig2-zero-100B)": (8192, 64, 32, 16),
    "Megatron 8.3B, MP 8 (megatron/8.3B-mp8)": (3072, 32, 8, 8),
    "Megatron 1.2B, MP 1 (megatron/1.2B-1gpu)": (1536, 16, 8, 1),
    "Megatron 1.2B, MP 8 (megatron/1.2B-mp8)": (1536, 16, 8, 8),
}


def layer_breakdown(gpu, hidden: int, heads: int, batch: int, mp: int) -> tuple[float, float, float]:
    """(GEMM seconds, GEMM FLOPs, memory-bound seconds) of one layer's forward ×2 and backward on `gpu`."""
    terms, peak, hbm = gpu.compute, gpu.peak_flops["fp16"], gpu.hbm_bytes_per_s
    x = Shape(s=1024, b=batch, h=hidden, a=heads, t=mp, v=51200, ffn=4 * hidden, kv_heads=heads, gated=False,
              linear_bias=True, qkv_bias=True, e=2)
    gemm = flops = mem = 0.0
    for kernels, times in ((block_forward(x), 2), (block_backward(x), 1)):
        for k in kernels:
            seconds = kernel_seconds(k, terms, peak, hbm, "fp16", 2) * times
            if k.kind == "gemm":
                gemm, flops = gemm + seconds, flops + k.flops * times
            else:
                mem += seconds
    return gemm, flops, mem


def deepbench_error_by_size(gpu) -> list[tuple[str, int, float]]:
    """(GFLOP range, rows, median predicted/measured − 1) of the DeepBench fp16 rows, by GEMM size."""
    g = gpu.compute.gemm_terms("fp16")
    rows = []
    with DEEPBENCH.open() as f:
        for r in csv.DictReader(f):
            m, n, k, t = int(r["M"]), int(r["N"]), int(r["K"]), float(r["time_ms"]) * 1e-3
            p = gemm_seconds(m, n, k, 1, 2, g, gpu.compute.sms, gpu.compute.tiles, gpu.peak_flops["fp16"],
                             gpu.hbm_bytes_per_s)
            rows.append((2 * m * n * k / 1e9, p / t - 1))
    out = []
    for lo, hi in ((0, 1), (1, 5), (5, 50), (50, float("inf"))):
        errors = [e for gf, e in rows if lo <= gf < hi]
        out.append((f"{lo:g}-{hi:g} GFLOP", len(errors), statistics.median(errors)))
    return out


def main() -> None:
    gpu = load_cluster("dgx2", 1).gpu
    print(f"{'run':<42} {'GEMM ms':>8} {'TFLOPS':>7} {'mem ms':>7} {'GEMM share':>10}")
    for name, shape in RUNS.items():
        gemm, flops, mem = layer_breakdown(gpu, *shape)
        print(f"{name:<42} {gemm * 1e3:>8.1f} {flops / gemm / 1e12:>7.0f} {mem * 1e3:>7.1f} "
              f"{gemm / (gemm + mem):>10.0%}")
    if not DEEPBENCH.is_file():
        print(f"\n(DeepBench table not found at {DEEPBENCH}: skipped)")
        return
    print(f"\n{'DeepBench V100 fp16 rows':<24} {'rows':>5} {'median error':>13}")
    for label, n, median in deepbench_error_by_size(gpu):
        print(f"{label:<24} {n:>5} {median:>+13.1%}")


if __name__ == "__main__":
    main()

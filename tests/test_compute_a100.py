"""The A100 profiles' GEMM terms are carried over from the V100 fit (no A100 shape table exists,
docs/compute.md "What the A100 rests on"); these are the two published A100 shapes they are checked on.
Neither set any term."""

import pytest

from zsim.compute.gemm import gemm_seconds
from zsim.fabric.cluster import load_cluster


def _tflops(gpu: str, m: int, n: int, k: int) -> tuple[float, float]:
    """(burst, sustained) bf16 TFLOPS zsim gives one m×n×k GEMM on `gpu`."""
    g = load_cluster("dgx-a100", 1, gpu=gpu).gpu
    t = g.compute
    s = gemm_seconds(m, n, k, 1, 2, t.gemm_terms("bf16"), t.sms, t.tiles, g.peak_flops["bf16"], g.hbm_bytes_per_s)
    burst = 2.0 * m * n * k / s / 1e12
    return burst, burst * t.sustained_ratio


@pytest.mark.parametrize("gpu", ["a100-sxm4-80gb", "a100-sxm4-40gb"])
def test_mamf_best_shape_within_5_percent(gpu):
    """ml-engineering's MAMF table: A100 SXM bf16, best shape 6912x16384x2048, 267.9 TFLOPS (a burst)."""
    burst, _ = _tflops(gpu, 6912, 16384, 2048)
    assert abs(burst / 267.9 - 1) < 0.05


@pytest.mark.parametrize("gpu", ["a100-sxm4-80gb", "a100-sxm4-40gb"])
def test_8192_cubed_under_the_power_cap_within_10_percent(gpu):
    """thonking.ai (H. He, 2024): 8192^3 bf16 cuBLAS at 400 W ran at 258 TFLOPS with randn inputs (sustained)."""
    _, sustained = _tflops(gpu, 8192, 8192, 8192)
    assert abs(sustained / 258.0 - 1) < 0.10

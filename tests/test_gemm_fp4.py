"""The Blackwell NVFP4 GEMM terms (`gemm.fp4`): fitted to the published FP4 GEMM table of a B200
(data/published/gemm-fp4/, benchmarks/fp4_gemm_check.py; docs/compute.md "NVFP4 GEMMs")."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from zsim.calibrate.gemm_fit import predict
from zsim.fabric.cluster import load_cluster

ROOT = Path(__file__).resolve().parents[1]


def _check():
    spec = importlib.util.spec_from_file_location("fp4_gemm_check", ROOT / "benchmarks" / "fp4_gemm_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_b200_fp4_efficiency_is_the_fit_to_the_published_table():
    """The profile's value is what the benchmark's fit gives (to the 4 places a profile keeps), not hand-set; the
    other four terms are the bf16 fit's."""
    check = _check()
    gemm = load_cluster("dgx-b200", 1).gpu.compute.gemm
    assert gemm["fp4"].efficiency == pytest.approx(round(check.fitted(), 4), abs=5e-5)
    assert gemm["fp4"].efficiency < gemm["bf16"].efficiency
    for term in ("tile_bytes_per_s", "k_overhead", "fixed_s", "hbm_efficiency"):
        assert getattr(gemm["fp4"], term) == getattr(gemm["bf16"], term)


def test_the_fitted_terms_meet_the_training_rows_where_the_carried_ones_were_fast():
    """docs/compute.md's figures: carried from bf16, zsim was 28% and 14% fast on the two rows with M >= 4096; fitted,
    within 10% of both (-9.4%, +9.5%)."""
    check = _check()
    hw, bf16 = check.b200()
    fp4 = load_cluster("dgx-b200", 1).gpu.compute.gemm["fp4"]
    train = [r for r in check.rows() if r.m >= check.TRAINING_M]
    assert [(r.m, r.n, r.k) for r in train] == [(4096, 4096, 7168), (8192, 8192, 8192)]
    carried = [predict(r, bf16, hw) / r.seconds - 1 for r in train]
    assert carried[0] < -0.27 and carried[1] < -0.13
    fitted = [predict(r, fp4, hw) / r.seconds - 1 for r in train]
    assert max(abs(e) for e in fitted) < 0.10


@pytest.mark.parametrize("gpu", ["b300-269gb", "gb200-185gb", "gb300-278gb"])
def test_the_other_blackwell_gpus_carry_the_b200_fp4_terms(gpu):
    from zsim.config.profile_files import GpuFile, Profiles, load_profile

    profiles = Profiles.from_environment([])
    b200 = load_profile(profiles, "gpu", "b200-180gb", GpuFile)
    other = load_profile(profiles, "gpu", gpu, GpuFile)
    assert other.compute.gemm["fp4"] == b200.compute.gemm["fp4"]


def test_gemm_fit_fits_an_fp4_table_at_the_fp4_peak_with_half_byte_operands(tmp_path):
    """`zsim gemm-fit --dtype fp4`: a DeepBench-style table timed by the model itself (the B200's fitted fp4 terms at
    its FP4 peak, half-byte operands) is fitted back to within 1% in sample, its efficiency within 5%."""
    from zsim.commands.gemm_fit import fit_table
    from zsim.compute.gemm import gemm_seconds

    gpu = load_cluster("dgx-b200", 1).gpu
    c = gpu.compute
    shapes = [(m, n, k) for m in (256, 1024, 4096, 16384) for n in (512, 4096, 14336) for k in (1024, 4096)]
    lines = ["M,N,K,time_ms"] + [
        f"{m},{n},{k},{1e3 * gemm_seconds(m, n, k, 1, 0.5, c.gemm['fp4'], c.sms, c.tiles, gpu.peak_flops['fp4'], gpu.hbm_bytes_per_s)!r}"
        for m, n, k in shapes]
    table = tmp_path / "fp4.csv"
    table.write_text("\n".join(lines) + "\n")
    result = fit_table(table, "b200-180gb", "fp4")
    assert result.summary()["insample_median"] < 0.01
    assert result.values["efficiency"] == pytest.approx(c.gemm["fp4"].efficiency, rel=0.05)


def test_gemm_fit_fp4_on_a_gpu_without_an_fp4_peak_names_the_key():
    from zsim.commands.gemm_fit import fit_table
    from zsim.errors import ZsimError

    with pytest.raises(ZsimError, match="peak_fp4_tflops"):
        fit_table(ROOT / "data" / "published" / "gemm-fp4" / "deepgemm-pr348-b200-mxfp4.csv", "h100-sxm5-80gb", "fp4")

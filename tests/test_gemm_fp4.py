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

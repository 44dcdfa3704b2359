"""The kernel-level compute model: kernel lists against the closed-form FLOPs, the GEMM model's shape
effects, its fit to DeepBench out of sample, and the profile's compute: section with overrides."""

import dataclasses

import pytest

from tests.conftest import SHARED_DATA, small_scenario
from zsim.calibrate.gemm_fit import GemmHardware, fit, read_gemm_csv
from zsim.compute.gemm import gemm_seconds
from zsim.compute.kernel_shape import Shape
from zsim.compute.kernels import module_kernels
from zsim.compute.optimizer_kernels import optimizer_kernels
from zsim.compute.model import list_seconds
from zsim.config.profile_files import ComputeOverride
from zsim.fabric.cluster import compute_terms, load_cluster
from zsim.errors import ConfigError, ZsimError
from zsim.workload.transformer import padded_vocab
from zsim.config.validation import validate

V100 = load_cluster("dgx2", 1).gpu


def shape(model, mp=1, dtype="fp16"):
    return Shape.of(model, mp, padded_vocab(model.vocab, mp), dtype)


@pytest.mark.parametrize("mp", [1, 2, 4])
def test_block_gemm_flops_are_the_closed_form(mp):
    """The block's GEMMs add up to (24bsh² + 4bs²h)/t forward [N21 §5.1] and twice that backward."""
    m = small_scenario(parallel={"dp": 32 // mp, "mp": mp}).model
    x = shape(m, mp)
    b, s, h = m.micro_batch, m.seq_len, m.hidden
    fwd = module_kernels("block", "fwd", x).flops
    assert fwd == pytest.approx((24 * b * s * h * h + 4 * b * s * s * h) / mp)
    assert module_kernels("block", "bwd", x).flops == pytest.approx(2 * fwd)
    assert module_kernels("block", "recompute", x) is module_kernels("block", "fwd", x)  # shared, cached
    head = module_kernels("head", "fwd", x).flops
    assert head == pytest.approx(2 * b * s * h * x.v / mp)


def test_gated_mlp_and_gqa_change_the_gemms():
    m = small_scenario().model
    base = module_kernels("block", "fwd", shape(m)).flops
    gated = dataclasses.replace(shape(m), gated=True)
    assert module_kernels("block", "fwd", gated).flops > base
    gqa = dataclasses.replace(shape(m), kv_heads=1)
    assert module_kernels("block", "fwd", gqa).flops < base


def test_gemm_model_has_wave_quantization_and_a_roofline():
    c, g = V100.compute, V100.compute.gemm["fp16"]
    t = lambda m, n, k, batch=1: gemm_seconds(m, n, k, batch, 2, g, c.sms, c.tiles, 125e12, 900e9)  # noqa: E731
    # 80 tiles of 256x128 fill one wave; one more row costs far more than its 1/20480 share of work
    # (a second, nearly empty wave, or a less efficient tiling).
    assert t(80 * 256 + 1, 128, 4096) / t(80 * 256, 128, 4096) > 1.03
    # Large square GEMMs reach 80-95% of peak; a skinny one is memory-bound at most at HBM speed.
    big = 2 * 8192**3 / t(8192, 8192, 8192) / 125e12
    assert 0.8 < big < 0.95
    skinny = t(1024, 8, 500_000)
    assert skinny >= (1024 * 500_000 * 2) / 900e9
    assert t(1024, 1024, 1024, batch=8) > t(1024, 1024, 1024)


def test_small_kernels_wait_for_the_host():
    """A layer of tiny shapes is host-bound: launches × host_op_us."""
    m = small_scenario(model={"hidden": 64, "heads": 4, "seq_len": 16, "micro_batch": 1}).model
    kl = module_kernels("block", "fwd", shape(m))
    seconds = list_seconds(kl, V100.compute, V100.peak_flops["fp16"], V100.hbm_bytes_per_s, "fp16")
    assert seconds == pytest.approx(kl.launches * V100.compute.host_op_s)


def test_optimizer_kernels_move_80_bytes_per_element_in_fp16():
    ks = optimizer_kernels(10**6, 10, "fp16")
    total = sum(k.bytes for kl in ks.values() for k in kl.kernels)
    assert total == 80 * 10**6
    assert not optimizer_kernels(10**6, 10, "fp32")["overflow"].kernels


def test_system_compute_override_replaces_keys():
    gpu = load_cluster("dgx2", 1).gpu
    section = __import__("zsim.fabric.cluster", fromlist=["GpuFile"])
    from zsim.config.profiles import Profiles

    spec = section.load_profile(Profiles.from_environment(), "gpu", "v100-sxm3-32gb", section.GpuFile)
    over = validate(ComputeOverride, {"host_op_us": 4.0, "gemm": {"fp16": {"efficiency": 0.5}}}, "test")
    terms = compute_terms(spec.compute, over, "test")
    assert terms.host_op_s == pytest.approx(4e-6) and terms.gemm["fp16"].efficiency == 0.5
    assert terms.gemm["fp16"].fixed_s == gpu.compute.gemm["fp16"].fixed_s  # the rest stays the GPU's
    with pytest.raises(ConfigError, match="compute.gemm.bf16"):
        compute_terms(spec.compute, validate(ComputeOverride, {"gemm": {"bf16": {"efficiency": 0.5}}}, "test"), "test")


def test_bad_gemm_csv_names_the_line(tmp_path):
    bad = tmp_path / "g.csv"
    bad.write_text("M,N,K,time_ms\n" + "64,64,64,0.01\n" * 12 + "64,x,64,0.01\n")
    with pytest.raises(ZsimError, match="line 14"):
        read_gemm_csv(bad)
    short_row = tmp_path / "s.csv"
    short_row.write_text("M,N,K,time_ms\n" + "64,64,64,0.01\n" * 12 + "64,64\n")
    with pytest.raises(ZsimError, match=r"line 14: no value in column\(s\) K, time_ms"):
        read_gemm_csv(short_row)
    zero_batch = tmp_path / "b.csv"
    zero_batch.write_text("M,N,K,time_ms,batch\n" + "64,64,64,0.01,1\n" * 12 + "64,64,64,0.01,0\n")
    with pytest.raises(ZsimError, match="line 14: batch '0'"):
        read_gemm_csv(zero_batch)
    missing = tmp_path / "m.csv"
    missing.write_text("M,N,time_ms\n1,2,3\n")
    with pytest.raises(ZsimError, match="missing column"):
        read_gemm_csv(missing)


@pytest.mark.parametrize("csv,peak,elem", [("gemm_fp16_tensorcore.csv", 125e12, 2), ("gemm_fp32.csv", 15.7e12, 4)])
def test_gemm_fit_predicts_unseen_deepbench_shapes(shared_data, csv, peak, elem):
    """Out of sample (even/odd rows, 2-fold): median error at most 10% on DeepBench's V100 GEMMs."""
    rows = read_gemm_csv(shared_data / "deepbench-v100" / csv)
    c = V100.compute
    result = fit(rows, GemmHardware(c.sms, c.tiles, peak, 900e9, elem))
    assert len(result.heldout_errors) == len(rows) == 160
    assert result.heldout_median <= 0.10
    # The profile carries this fit (to its printed precision).
    dtype = "fp16" if elem == 2 else "fp32"
    assert result.values["efficiency"] == pytest.approx(V100.compute.gemm[dtype].efficiency, abs=1e-3)


def test_rotary_drops_the_position_table_and_rotates_q_and_k():
    x = shape(small_scenario().model)
    rot = dataclasses.replace(x, rotary=True)
    names = lambda kl: {k.name for k in kl.kernels}  # noqa: E731
    assert "attention.rotary" in names(module_kernels("block", "fwd", rot))
    assert "embed.position" not in names(module_kernels("embed", "fwd", rot))
    assert "embed.position" in names(module_kernels("embed", "fwd", x))

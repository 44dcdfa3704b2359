"""XLA's GEMM tables (zsim.trace.xla_gemm) and the GPU profiles fitted to them: the reader's exact times
and typed errors, `zsim gemm-fit` on the XLA layout, the held-out medians of the H100 and B200 fits
(skipped without ../shared/data), and the sustained-clock ratio the engine applies to tensor-core work."""

import json
import statistics

import pytest

from tests.conftest import ROOT
from zsim.calibrate.gemm_fit import family_holdout, fit, read_gemm_csv
from zsim.commands.gemm_fit import table_hardware
from zsim.compute.kernel_list import Kernel, KernelList
from zsim.compute.model import list_seconds
from zsim.config.profile_files import GpuFile, load_profile
from zsim.fabric.cluster import load_cluster
from zsim.config.profiles import Profiles
from zsim.errors import ConfigError, ZsimError
from zsim.calibrate.inputs import kind_of, read_inputs
from zsim.trace.xla_gemm import read_xla_table

XLA = ROOT.parent / "shared" / "data" / "gemm-xla"
HEADER = "b,m,n,k,dtype,flops_per_s,tflops\n"


def _table(tmp_path, rows, name="t.csv"):
    path = tmp_path / name
    path.write_text(HEADER + "".join(rows))
    return path


def _synthetic(tmp_path):
    """A table of 16 bf16 and 16 f32 shapes whose rates follow a simple rule (not a measurement)."""
    rows = []
    for b in (1, 2):
        for m in (256, 1024):
            for n in (512, 2048):
                for k in (256, 4096):
                    for dtype, peak in (("bf16xbf16->bf16", 600e12), ("f32xf32->f32", 300e12)):
                        flops = 2 * b * m * n * k
                        rate = flops / (6e-6 + flops / peak)
                        rows.append(f"{b},{m},{n},{k},{dtype},{rate:.0f},{rate / 1e12:.4f}\n")
    return _table(tmp_path, rows)


def test_reader_recovers_times_and_maps_dtypes(tmp_path):
    path = _table(tmp_path, ["2,256,512,1024,bf16xbf16->bf16,1000000000000,1.0\n",
                             "1,256,256,256,f32xf32->f32,6026298850574,6.0263\n"])
    bf16, tf32 = read_xla_table(path)
    assert (bf16.dtype, bf16.shape) == ("bf16", (256, 512, 1024, 2))
    assert bf16.seconds == pytest.approx(2 * 2 * 256 * 512 * 1024 / 1e12)  # 2·b·m·n·k / flops_per_s, exactly
    assert tf32.dtype == "tf32"  # XLA runs f32 dots on TF32 tensor cores (zsim.trace.xla_gemm)
    assert kind_of(path) == "gemm-table"
    assert [s.dtype for s in read_inputs([path]).compute] == ["bf16", "tf32"]


@pytest.mark.parametrize("row,message", [
    ("0,256,256,256,bf16xbf16->bf16,1e12,1\n", "line 2: b '0' is not an integer"),
    ("1,256,x,256,bf16xbf16->bf16,1e12,1\n", "line 2: n 'x' is not an integer"),
    ("1,256,256,256,f8e5m2xf8e5m2->bf16,1e12,1\n", "line 2: dtype 'f8e5m2xf8e5m2->bf16' is not one of"),
    ("1,256,256,256,bf16xbf16->bf16,-5,1\n", "line 2: flops_per_s '-5' is not a finite number > 0"),
])
def test_bad_rows_name_the_line_and_column(tmp_path, row, message):
    with pytest.raises(ConfigError, match=message):
        read_xla_table(_table(tmp_path, [row]))


def test_mixed_table_needs_a_dtype(tmp_path):
    path = _synthetic(tmp_path)
    with pytest.raises(ZsimError, match="no fp16 rows; the table holds bf16, tf32"):
        read_gemm_csv(path, "fp16")
    assert {r.batch for r in read_gemm_csv(path, "bf16")} == {1, 2}


def test_gemm_fit_command_reads_the_xla_layout(tmp_path, capsys):
    from zsim.cli import main

    out = tmp_path / "fit.json"
    assert main(["gemm-fit", str(_synthetic(tmp_path)), "--gpu", "h100-sxm5-80gb", "--dtype", "tf32",
                 "--json", str(out)]) == 0
    assert "tf32: {efficiency:" in capsys.readouterr().out
    assert json.loads(out.read_text())["summary"]["rows"] == 16


def test_a_gpu_without_a_tf32_peak_is_refused():
    spec = load_profile(Profiles.from_environment([]), "gpu", "v100-sxm3-32gb", GpuFile)
    with pytest.raises(ZsimError, match="no tf32 peak"):
        table_hardware(spec, "v100-sxm3-32gb", "tf32")


# Held-out bounds fixed when the fits were first made (docs/compute.md, "H100 and B200"): a few points above
# the medians then reached, so a change to the model or the reader that loses accuracy fails here.
# `carried`: whether the profile carries that fit. The H100's bf16 terms are the H200's PyTorch fit instead
# (same die; XLA's table runs above PyTorch's GEMMs: docs/compute.md, "A known gap ... changed").
@pytest.mark.parametrize("table,gpu,dtype,bound,carried", [
    ("xla-sm_90.csv", "h100-sxm5-80gb", "bf16", 0.04, False),
    ("xla-sm_90.csv", "h100-sxm5-80gb", "tf32", 0.15, True),
    ("xla-sm_100_B200.csv", "b200-180gb", "bf16", 0.05, True),
    ("xla-sm_100_B200.csv", "b200-180gb", "tf32", 0.05, True),
])
def test_xla_fit_predicts_unseen_shapes(table, gpu, dtype, bound, carried):
    if not (XLA / table).is_file():
        pytest.skip(f"{XLA / table} absent")
    spec = load_profile(Profiles.from_environment([]), "gpu", gpu, GpuFile)
    hw = table_hardware(spec, gpu, dtype)
    rows = read_gemm_csv(XLA / table, dtype)
    result = fit(rows, hw)
    assert len(rows) == len(result.heldout_errors) == 375
    assert result.heldout_median <= bound  # even/odd 2-fold
    assert statistics.median(family_holdout(rows, hw)) <= bound + 0.01  # fit batch 1, predict batch 2 and 4
    # the profile carries this fit (to its printed precision), or the H200's PyTorch fit (H100 bf16)
    if carried:
        assert result.values["efficiency"] == pytest.approx(spec.compute.gemm[dtype].efficiency, abs=2e-3)
    else:
        h200 = load_profile(Profiles.from_environment([]), "gpu", "h200-sxm-141gb", GpuFile)
        assert spec.compute.gemm[dtype] == h200.compute.gemm[dtype]


def test_sustained_ratio_slows_compute_bound_gemms_only():
    gpu = load_cluster("dgx-h100", 1).gpu
    t = gpu.compute
    assert t.sustained_ratio == 0.92
    big = KernelList("big", (Kernel("gemm", "gemm", m=8192, n=8192, k=8192),))
    copy = KernelList("copy", (Kernel("copy", "mem", bytes=1e9),))
    import dataclasses

    burst = dataclasses.replace(t, sustained_ratio=1.0)
    ratio = list_seconds(big, t, gpu.peak_flops["bf16"], gpu.hbm_bytes_per_s, "bf16") / \
        list_seconds(big, burst, gpu.peak_flops["bf16"], gpu.hbm_bytes_per_s, "bf16")
    assert 1 / 0.92 * 0.97 < ratio <= 1 / 0.92 + 1e-9  # compute-bound: nearly 1/ratio (fixed_us is not scaled)
    assert list_seconds(copy, t, 1.0, gpu.hbm_bytes_per_s, "bf16") == list_seconds(copy, burst, 1.0,
                                                                                    gpu.hbm_bytes_per_s, "bf16")


# flashinfer-ai/flashinfer PR #2899 (a B200): FlashAttention-4 back to back, 1450 TFLOPS warmed (iterations 10-19) and
# 1237 fully throttled (70-79); docs/compute.md, "Sustained clocks"
B200_WARMED_TFLOPS, B200_THROTTLED_TFLOPS = 1450, 1237


# SMs x maximum SM clock (GHz) of each Blackwell GPU, what a burst runs at: B200 148 x 1.965 and GB200 152 x 2.062
# (ByteDance-Seed/VeOmni PR #986), GB300 152 (facebookexperimental/triton PR #2768) x 2.070 (triton PR #2023);
# the B300 has no published count or clock and carries the B200's ratio as is.
BURST = {"dgx-b200": 148 * 1.965, "gb200-nvl72": 152 * 2.062, "gb300-nvl72": 152 * 2.070}
DATASHEET_BF16 = {"dgx-b200": 2250, "gb200-nvl72": 2500, "gb300-nvl72": 2500}


@pytest.mark.parametrize("system", ["dgx-b200", "gb200-nvl72", "dgx-b300", "gb300-nvl72"])
def test_blackwell_sustained_ratio_is_the_published_b200_throttle(system):
    """The B200's ratio is the published throttled/warmed rate (to the profile's three digits); B300, GB200 and GB300
    carry it. The GB200 and GB300 also have a burst_ratio, their burst ratio to a B200 (SMs x maximum clock) over their
    datasheets' ratio, which their GEMM terms, shares of the datasheet peak, would credit. A compute-bound GEMM is
    slower than its burst by both; memory-bound work is not."""
    import dataclasses

    gpu = load_cluster(system, 1).gpu
    t = gpu.compute
    b200 = round(B200_THROTTLED_TFLOPS / B200_WARMED_TFLOPS, 3)
    assert b200 == 0.853
    assert t.sustained_ratio == b200
    if system in ("gb200-nvl72", "gb300-nvl72"):
        credit = (BURST[system] / BURST["dgx-b200"]) / (DATASHEET_BF16[system] / DATASHEET_BF16["dgx-b200"])
        assert 0.96 < credit < 0.98
        assert t.burst_ratio == round(credit, 3)
        assert t.sms == 152
    else:
        assert t.burst_ratio == 1.0
    assert t.tensor_rate == pytest.approx(t.sustained_ratio * t.burst_ratio)
    big = KernelList("big", (Kernel("gemm", "gemm", m=8192, n=8192, k=8192),))
    burst = dataclasses.replace(t, sustained_ratio=1.0, burst_ratio=1.0)
    ratio = list_seconds(big, t, gpu.peak_flops["bf16"], gpu.hbm_bytes_per_s, "bf16") / \
        list_seconds(big, burst, gpu.peak_flops["bf16"], gpu.hbm_bytes_per_s, "bf16")
    assert 1 / t.tensor_rate * 0.97 < ratio <= 1 / t.tensor_rate + 1e-9
    copy = KernelList("copy", (Kernel("copy", "mem", bytes=1e9),))
    assert list_seconds(copy, t, 1.0, gpu.hbm_bytes_per_s, "bf16") == \
        list_seconds(copy, burst, 1.0, gpu.hbm_bytes_per_s, "bf16")


def test_sustained_ratio_out_of_range_is_a_config_error(tmp_path):
    src = (ROOT / "hwprofiles" / "gpus" / "h100-sxm5-80gb.yaml").read_text()
    (tmp_path / "gpus").mkdir()
    (tmp_path / "gpus" / "hot.yaml").write_text(src.replace("sustained_ratio: 0.92", "sustained_ratio: 1.5"))
    with pytest.raises(ConfigError, match="sustained_ratio"):
        load_profile(Profiles.from_environment([str(tmp_path)]), "gpu", "hot", GpuFile)


def test_h200_sustained_ratio_is_the_measured_one():
    summary = ROOT / "data" / "device" / "20261126-h200-sustained" / "summary.json"
    if not summary.is_file():
        pytest.skip("no sustained-clock measurement in data/device")
    measured = json.loads(summary.read_text())["ratio_last30_to_burst"]
    gpu = load_cluster("hgx-h200", 1).gpu
    assert gpu.compute.sustained_ratio == pytest.approx(measured, abs=0.005)


def test_calibrate_fits_each_dtype_of_an_xla_table_with_its_batches(tmp_path):
    from zsim.calibrate.gpu_compute import calibrate_gemms

    cluster = load_cluster("dgx-h100", 1)
    values, summary = calibrate_gemms(cluster, read_xla_table(_synthetic(tmp_path)))
    assert set(values) == {"bf16", "tf32"} and summary["bf16"]["rows"] == 16
    # the synthetic rates hold 6 µs of fixed time per call (batch 2 rows included): the fit finds it
    assert values["bf16"]["fixed_us"] == pytest.approx(6.0, abs=1.5)

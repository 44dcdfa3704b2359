"""zsim.compute.flash against fused attention timed on an H200 (the device check's part (e); skipped without
the data). The H200 has the H100's 989 dense 16-bit TFLOPS (datasheets), so the curves fitted to the
FlashAttention papers' H100 tables apply unchanged. PyTorch's `flash` backend is FlashAttention-2; cuDNN's
sm90 fused attention is compared with the FlashAttention-3 curve (the class zsim prices for Hopper,
`attention: flash3`).

- data/device/20261127-h200-attention (head dim 128) was read before these checks were written: the
  forward and full-mask comparisons pin what the published fit does on a GPU it never saw. Its causal
  backward ratios at 512, 2k and 8k tokens are the fit of `causal_backward` (zsim prices the causal
  backward at the full-mask rate times that ratio); 1k, 4k and 16k are held out.
- data/device/20261127-h200-attention-hd (head dims 64 and 256, measured before the ratio was fitted) is
  held out from the causal ratio. Its full-mask backward at head dim 256 over head dim 128's, at 512, 2k and
  8k tokens, is `backward_head_dim_factor` (no backward panel at 256 is published); its other lengths are
  held out, and the same construction at head dim 64 is checked against the published 64 panel. Every
  other comparison at head dims 64 and 256 is with the published panels at those head dims (since
  commit ac0386f; before it, the 128 panels ran every head dim, up to 42% too fast)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from zsim.compute.flash import (FIT_LENGTHS, H100_PEAK_TFLOPS, PUBLISHED, backward_head_dim_factor, causal_backward,
                               efficiency, h100_curve)

DEVICE = Path(__file__).resolve().parents[1] / "data" / "device"
TABLES = [DEVICE / "20261127-h200-attention" / "attention.csv", DEVICE / "20261127-h200-attention-hd" / "attention.csv"]
pytestmark = pytest.mark.skipif(not all(t.is_file() for t in TABLES), reason="no measured attention tables in data/device/")
HOPPER = 90


def _rates(backend: str, phase: str, causal: bool, head_dim: int = 128) -> dict[int, float]:
    rows = []
    for table in TABLES:
        with table.open() as fh:
            rows += list(csv.DictReader(fh))
    return {int(r["seq_len"]): float(r["tflops"]) for r in rows if r["backend"] == backend and r["pass"] == phase
            and r["causal"] == str(causal) and r["head_dim"] == str(head_dim) and r["tflops"]}


def _model(version: int, phase: str, head_dim: int = 128) -> dict[int, float]:
    """zsim's rate (TFLOPs/s) for a causal GPT's kernel on Hopper, by length."""
    return {s: efficiency(version, phase, HOPPER, s, head_dim) * H100_PEAK_TFLOPS
            for s in (512, 1024, 2048, 4096, 8192, 16384)}


@pytest.mark.parametrize("backend,version", [("flash", 2), ("cudnn", 3)])
def test_the_causal_forward_matches_the_measured_kernel(backend, version):
    measured, model = _rates(backend, "fwd", True), _model(version, "fwd")
    errors = {s: model[s] / measured[s] - 1 for s in measured}
    assert sorted(errors) == [512, 1024, 2048, 4096, 8192, 16384]
    assert all(abs(e) <= 0.15 for e in errors.values()), errors  # FA2 +1..+9%, cuDNN/FA3 -14..+4%


@pytest.mark.parametrize("backend,version,head_dim", [
    ("flash", 2, 256),  # -2..+4%
    pytest.param("flash", 2, 64, marks=pytest.mark.xfail(strict=True, reason=(
        "FA2 at head dim 64, 512 tokens: the published panel +19% over PyTorch's kernel (1k +7%, 2k-16k +2..+3%)"))),
    pytest.param("cudnn", 3, 64, marks=pytest.mark.xfail(strict=True, reason=(
        "cuDNN beats FA3's published head-dim-64 panel at 512 tokens: -26% (1k -15%, 2k -8%, 4k-16k -1..+8%)"))),
    pytest.param("cudnn", 3, 256, marks=pytest.mark.xfail(strict=True, reason=(
        "cuDNN beats FA3's published head-dim-256 panel at 512 tokens: -20% (1k -9%, 2k-16k -3..+10%)"))),
])
def test_the_causal_forward_at_other_head_dims_matches_the_measured_kernel(backend, version, head_dim):
    """The published panels at head dims 64 and 256 against the kernels timed there, every length held out
    (the 15% of head dim 128's check; with the 128 panels they were up to 42% too fast)."""
    measured, model = _rates(backend, "fwd", True, head_dim), _model(version, "fwd", head_dim)
    errors = {s: model[s] / measured[s] - 1 for s in measured}
    assert len(errors) == 6 and all(abs(e) <= 0.15 for e in errors.values()), errors


@pytest.mark.parametrize("version,backend", [(2, "flash"), (3, "cudnn")])
def test_the_head_dim_factor_predicts_the_published_64_backward(version, backend):
    """`backward_head_dim_factor`'s construction (the published 128 backward times the measured ratio of
    head dims at 512, 2k and 8k tokens) made for head dim 64 and held against the published 64 panel,
    which it never reads: within 10% at every length (FA2 +0..+3%, FA3 class -3..-6%)."""
    full_128, full_64 = _rates(backend, "bwd", False), _rates(backend, "bwd", False, 64)
    factor = sum(full_64[s] / full_128[s] for s in FIT_LENGTHS) / len(FIT_LENGTHS)
    published_128, published_64 = dict(PUBLISHED[(version, "bwd", 128)]), dict(PUBLISHED[(version, "bwd", 64)])
    errors = {s: published_128[s] * factor / r - 1 for s, r in published_64.items()}
    assert len(errors) == 6 and all(abs(e) <= 0.10 for e in errors.values()), errors


@pytest.mark.parametrize("version,backend", [(2, "flash"), (3, "cudnn")])
def test_the_head_dim_256_backward_holds_out(version, backend):
    """The head-dim-256/128 factor (fitted at 512, 2k, 8k) on the lengths it did not see, within 15% (the
    bar of the other head dims' held-out checks): FA2 -2..+4%, cuDNN -10..+7%."""
    full_128, full_256 = _rates(backend, "bwd", False), _rates(backend, "bwd", False, 256)
    # the factor zsim carries is this table's, at the fit's lengths (MEASURED_BWD_HD256 copied from it)
    assert backward_head_dim_factor(version) == pytest.approx(
        sum(full_256[s] / full_128[s] for s in FIT_LENGTHS) / len(FIT_LENGTHS), rel=1e-4)
    errors = {s: backward_head_dim_factor(version) / (full_256[s] / full_128[s]) - 1
              for s in full_256 if s not in FIT_LENGTHS}
    assert len(errors) == 3 and all(abs(e) <= 0.15 for e in errors.values()), errors


@pytest.mark.parametrize("head_dim", [
    64,  # -2..+14%
    pytest.param(256, marks=pytest.mark.xfail(strict=True, reason=(
        "cuDNN's causal backward at head dim 256 beats the causal ratio (faster than its full mask at 8k-16k): "
        "-9% to -23%"))),
])
def test_the_causal_backward_at_other_head_dims_matches_cudnn(head_dim):
    measured, model = _rates("cudnn", "bwd", True, head_dim), _model(3, "bwd", head_dim)
    errors = {s: model[s] / r - 1 for s, r in measured.items()}
    assert len(errors) == 6 and all(abs(e) <= 0.15 for e in errors.values()), errors


def test_the_full_backward_matches_cudnn():
    measured, curve = _rates("cudnn", "bwd", False), h100_curve(3, "bwd")
    errors = {s: curve.at(s) * H100_PEAK_TFLOPS / r - 1 for s, r in measured.items()}
    assert all(abs(e) <= 0.05 for e in errors.values()), errors  # 0..+3%


def test_the_causal_backward_on_hopper_matches_cudnn():
    """The FlashAttention-3 class's causal backward: published full-mask rate × measured causal ratio,
    within 10% at every length (-1..+8%; it was up to 59% too fast at the full-mask rate alone)."""
    measured, model = _rates("cudnn", "bwd", True), _model(3, "bwd")
    errors = {s: model[s] / r - 1 for s, r in measured.items()}
    assert all(abs(e) <= 0.10 for e in errors.values()), errors


@pytest.mark.parametrize("backend,version,head_dim,tolerance", [
    pytest.param("flash", 2, 128, 0.10, marks=pytest.mark.xfail(strict=True, reason=(
        "FA2 at 16k tokens: measured causal/full ratio 1.00, the fit 0.90 (-10.3%); 1k +2.7%, 4k -0.2%"))),
    ("cudnn", 3, 128, 0.10),  # the lengths the fit did not see
    ("flash", 2, 64, 0.15), ("cudnn", 3, 64, 0.15), ("flash", 2, 256, 0.15),
    pytest.param("cudnn", 3, 256, 0.15, marks=pytest.mark.xfail(strict=True, reason=(
        "cuDNN at head dim 256: causal faster than full-mask at 8k-16k (ratio 1.07-1.10); the fit -3% (4k) to -21%"))),
])
def test_the_causal_backward_ratio_holds_out(backend, version, head_dim, tolerance):
    causal, full = _rates(backend, "bwd", True, head_dim), _rates(backend, "bwd", False, head_dim)
    lengths = [s for s in causal if head_dim != 128 or s not in FIT_LENGTHS]
    errors = {s: causal_backward(version).at(s) / (causal[s] / full[s]) - 1 for s in lengths}
    assert len(errors) >= 3 and all(abs(e) <= tolerance for e in errors.values()), errors


@pytest.mark.xfail(strict=True, reason="PyTorch's vendored FlashAttention-2 backward is slower than flash-attn's "
                                       "published one: the FA2 full-mask curve is +24% at 512 tokens, +8% at 16k")
def test_the_full_backward_matches_pytorchs_flash():
    measured, curve = _rates("flash", "bwd", False), h100_curve(2, "bwd")
    errors = {s: curve.at(s) * H100_PEAK_TFLOPS / r - 1 for s, r in measured.items()}
    assert all(abs(e) <= 0.15 for e in errors.values()), errors


def test_the_device_report_prints_these_comparisons():
    """benchmarks/device_report.py's attention rows (zsim.calibrate.device_report.attention_errors) are the
    comparisons above: the same errors, and the full-mask backward without the causal ratio."""
    from zsim.calibrate import device_report as dr

    rows = dr.attention_errors(dr.DeviceRun.read(TABLES[0].parent))
    by = {(r["backend"], r["pass"], r["causal"], r["head_dim"]): r["errors"] for r in rows}
    fwd = _rates("cudnn", "fwd", True)
    assert by[("cudnn", "fwd", True, 128)] == pytest.approx({s: _model(3, "fwd")[s] / r - 1 for s, r in fwd.items()})
    full = _rates("cudnn", "bwd", False)
    assert by[("cudnn", "bwd", False, 128)] == pytest.approx(
        {s: h100_curve(3, "bwd").at(s) * H100_PEAK_TFLOPS / r - 1 for s, r in full.items()})
    assert {r["head_dim"] for r in rows} == {128} and len(rows) == 8  # 2 backends x 2 passes x 2 masks


def test_the_device_report_prints_the_ratio_checks():
    """benchmarks/device_report.py's `causal/full backward ratio` rows are test_the_causal_backward_ratio_holds_out's
    errors, the fitted lengths marked."""
    from zsim.calibrate import device_report as dr

    rows = {(r["backend"], r["head_dim"]): r for r in dr.causal_ratio_errors(dr.DeviceRun.read(TABLES[0].parent))}
    flash = rows[("flash", 128)]
    causal, full = _rates("flash", "bwd", True), _rates("flash", "bwd", False)
    assert flash["errors"] == pytest.approx({s: causal_backward(2).at(s) / (causal[s] / full[s]) - 1 for s in causal})
    assert flash["fitted"] == set(FIT_LENGTHS) and flash["errors"][16384] == pytest.approx(-0.103, abs=0.001)
    held = {(r["backend"], r["head_dim"]): r for r in dr.causal_ratio_errors(dr.DeviceRun.read(TABLES[1].parent))}
    assert set(held) == {("flash", 64), ("flash", 256), ("cudnn", 64), ("cudnn", 256)}
    assert all(not r["fitted"] for r in held.values())

"""zsim.compute.flash, fitted to the FlashAttention papers' H100 tables, against fused attention timed on an
H200 (the device check's part (e), data/device/20261127-h200-attention; skipped without it). The H200 has
the H100's 989 dense 16-bit TFLOPS (datasheets), so the fitted curves apply unchanged. PyTorch's `flash`
backend is FlashAttention-2; cuDNN's sm90 fused attention is compared with the FlashAttention-3 curve
(the class zsim prices for Hopper, `attention: flash3`).

These comparisons were made after the data were read: they pin what the fit does on a GPU it never saw,
not a criterion fixed in advance. Forward, causal (the pass and mask the fit is built on) agrees within
15% at every length; the causal backward, which zsim prices at the non-causal rate (no causal backward
panel is published, flash.py), is optimistic by up to 94% at 512 tokens: a strict xfail, kept."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from zsim.compute.flash import H100_PEAK_TFLOPS, h100_curve

TABLE = Path(__file__).resolve().parents[1] / "data" / "device" / "20261127-h200-attention" / "attention.csv"
pytestmark = pytest.mark.skipif(not TABLE.is_file(), reason="no measured attention table in data/device/")


def _errors(backend: str, version: int, phase: str, causal: bool) -> dict[int, float]:
    """Predicted over measured TFLOPS − 1, by sequence length."""
    with TABLE.open() as fh:
        rows = [r for r in csv.DictReader(fh) if r["backend"] == backend and r["pass"] == phase
                and r["causal"] == str(causal) and r["tflops"]]
    curve = h100_curve(version, phase)
    return {int(r["seq_len"]): curve.at(int(r["seq_len"])) * H100_PEAK_TFLOPS / float(r["tflops"]) - 1 for r in rows}


@pytest.mark.parametrize("backend,version", [("flash", 2), ("cudnn", 3)])
def test_the_causal_forward_matches_the_measured_kernel(backend, version):
    errors = _errors(backend, version, "fwd", True)
    assert sorted(errors) == [512, 1024, 2048, 4096, 8192, 16384]
    assert all(abs(e) <= 0.15 for e in errors.values()), errors  # FA2 +1..+9%, cuDNN/FA3 -14..+4%


def test_the_full_backward_matches_cudnn():
    errors = _errors("cudnn", 3, "bwd", False)
    assert all(abs(e) <= 0.05 for e in errors.values()), errors  # 0..+3%


@pytest.mark.xfail(strict=True, reason="causal backward priced at the non-causal rate: +94% (FA2) and +59% "
                                       "(cuDNN) too fast at 512 tokens, +7-8% at 16k")
@pytest.mark.parametrize("backend,version", [("flash", 2), ("cudnn", 3)])
def test_the_causal_backward_matches_the_measured_kernel(backend, version):
    errors = _errors(backend, version, "bwd", True)
    assert all(abs(e) <= 0.15 for e in errors.values()), errors

"""FlashAttention on Blackwell (zsim.compute.flash, [B200]): NVIDIA's measured B200 table of cuDNN's fused attention
(zsim's `flash3` there) and flash-attn 2's own kernels (`flash2`), interpolated in log2(sequence); each interior length
predicted from its two neighbours alone is the held-out check."""

from __future__ import annotations

import statistics

import pytest

from tests.conftest import scenario_from
from zsim.compute.flash import B200_MEASURED, B200_PEAK_TFLOPS, BLACKWELL, blackwell_report, efficiency, supported


def test_the_measured_lengths_are_given_back():
    for version, table in B200_MEASURED.items():
        for seq, fwd, bwd in table:
            assert efficiency(version, "fwd", BLACKWELL, seq) * B200_PEAK_TFLOPS == pytest.approx(fwd)
            assert efficiency(version, "bwd", BLACKWELL, seq) * B200_PEAK_TFLOPS == pytest.approx(bwd)


def test_held_out_lengths_within_the_interpolations_error():
    """From 2k tokens up (below, 128 heads of one sequence leave the kernel launch-bound), each length predicted from
    the lengths either side of it alone: median |error| 3.7%, worst 15% (cuDNN's backward at 2k)."""
    errors = [abs(pred / meas - 1) for _, _, seq, meas, pred in blackwell_report() if seq >= 2048]
    assert len(errors) == 24
    assert statistics.median(errors) < 0.05 and max(errors) < 0.16


def test_cudnn_runs_three_times_flash_attn_2_on_a_b200():
    for seq in (4096, 8192, 32768):
        for phase in ("fwd", "bwd"):
            ratio = efficiency(3, phase, BLACKWELL, seq) / efficiency(2, phase, BLACKWELL, seq)
            assert 2.4 < ratio < 3.4, (seq, phase, ratio)
    assert supported(3, BLACKWELL) == "" and supported(3, 80) != ""  # flash3 on Blackwell is cuDNN's; not on Ampere


def test_auto_takes_cudnn_on_blackwell_and_flash2_elsewhere():
    base = {"model": {"layers": 2, "hidden": 1024, "heads": 16, "seq_len": 2048, "vocab": 32000, "micro_batch": 1,
                      "attention": "auto"},
            "parallel": {"dp": 8, "mp": 1}, "zero": {"stage": 1}, "precision": {"dtype": "bf16"}}
    assert scenario_from(base, "b200", hardware={"profile": "dgx-b200", "nodes": 1}).model.attention == "flash3"
    assert scenario_from(base, "h100", hardware={"profile": "dgx-h100", "nodes": 1}).model.attention == "flash2"

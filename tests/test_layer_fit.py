"""The memory-bound HBM efficiency fitted to published V100 timings of PyTorch's transformer layer
(zsim.calibrate.layer_fit): the kernel list's arithmetic, the closed-form fit, its held-out error, and
that the V100 profiles carry what the fit gives."""

import pytest

from zsim.calibrate import layer_fit as lf
from zsim.compute.torch_layer import encoder_layer_backward, encoder_layer_forward
from zsim.fabric.cluster import load_cluster
from zsim.errors import ZsimError


def _v100():
    gpu = load_cluster("dgx1", 1).gpu
    return gpu.compute, gpu.peak_flops["fp16"], gpu.hbm_bytes_per_s


def test_kernel_list_flops_are_the_layer_flops():
    """Forward GEMMs: 2·T·(4h² + 2hf) for the projections and MLP plus 4·b·s²·h for the two attention
    products; backward twice that."""
    b, s, h, a, f = 8, 512, 1024, 16, 4096
    T = b * s
    fwd = 2 * T * (4 * h * h + 2 * h * f) + 4 * b * s * s * h
    assert encoder_layer_forward(b, s, h, a, f).flops == fwd
    assert encoder_layer_backward(b, s, h, a, f).flops == 2 * fwd


def test_fit_recovers_a_known_efficiency():
    """Timings made by the model itself at η = 0.6 give back 0.6, in and out of sample."""
    terms, peak, hbm = _v100()
    made = []
    for t in lf.TIMINGS:
        p = lf.layer_parts(t, terms, peak, hbm)
        made.append(lf.LayerTiming(t.b, t.s, t.h, t.a, t.f, p.predict(0.6 * hbm) * 1e3))
    fit = lf.fit(terms, peak, hbm, tuple(made))
    assert fit.hbm_efficiency == pytest.approx(0.6, rel=1e-9)
    assert all(eta == pytest.approx(0.6, rel=1e-9) and err == pytest.approx(0.0, abs=1e-9) for eta, err in fit.heldout)


def test_published_timings_fit_and_hold_out():
    """On the real measurements: GEMMs take about half of each layer, the rest is memory-bound; one η
    fitted on one shape predicts the other within 10.5% (both ways), and the joint fit is within 10%."""
    fit = lf.fit(*_v100())
    assert 0.4 < fit.hbm_efficiency < 0.7
    for i, p in enumerate(fit.parts):
        assert 0.4 < p.gemm_s / (p.timing.ms * 1e-3) < 0.65
        assert abs(fit.error(i)) < 0.10
    assert all(err < 0.105 for _, err in fit.heldout)
    assert "b8 s512" in lf.report(fit) and "held out" in lf.report(fit)


def test_v100_profiles_carry_the_fit():
    fit = lf.fit(*_v100())
    for system in ("dgx1", "dgx2"):
        assert load_cluster(system, 1).gpu.compute.hbm_efficiency == pytest.approx(fit.hbm_efficiency, abs=5e-4)


def test_timings_faster_than_their_gemms_are_refused():
    terms, peak, hbm = _v100()
    fast = tuple(lf.LayerTiming(t.b, t.s, t.h, t.a, t.f, 1.0) for t in lf.TIMINGS)
    with pytest.raises(ZsimError, match="GEMMs alone"):
        lf.fit(terms, peak, hbm, fast)
    with pytest.raises(ZsimError, match="two timings"):
        lf.fit(terms, peak, hbm, lf.TIMINGS[:1])

"""The memory-bound terms of the compute model fitted to the real 8xV100 Kineto trace
(zsim.calibrate.kernel_fit): byte accounting per aten op, the fit's held-out error, what the trace can
and cannot determine, and that the V100 profile carries what the fit gives."""

import pytest

from tests.conftest import SHARED_DATA
from zsim.calibrate import kernel_fit as kf
from zsim.fabric.cluster import load_cluster
from zsim.errors import ZsimError

TRACES = SHARED_DATA / "kineto" / "dlrm-8xv100"


def test_bytes_per_op():
    n = 512 * 512
    assert kf.op_bytes("aten::sqrt", [[512, 512]], ["float"]) == 8 * n  # read + write
    assert kf.op_bytes("aten::add_", [[512, 512], [], []], ["float", "double", "Scalar"]) == 8 * n  # in place
    assert kf.op_bytes("aten::addcmul_", [[512, 512]] * 3 + [[]], ["float"] * 3 + ["Scalar"]) == 16 * n
    assert kf.op_bytes("aten::mul", [[512, 512], [], [512, 512]], ["float", "double", "float"]) == 8 * n  # out=
    assert kf.op_bytes("aten::fill_", [[100], []], ["int", "Scalar"]) == 400  # write only
    assert kf.op_bytes("aten::copy_", [[10], [10]], ["long int", "int"]) == 120  # write 8, read 4
    assert kf.op_bytes("aten::sum", [[16, 512], [], [], []], ["float", "", "Scalar", ""]) == 4 * 16 * 512 + 4
    assert kf.op_bytes("aten::cat", [[], []], ["TensorList", "Scalar"]) is None
    assert kf.kernel_class("aten::sum") == "reduce" and kf.kernel_class("aten::native_dropout") == "rng"


def test_fit_recovers_a_synthetic_bandwidth():
    """Kernels larger than L2 with t = 2 us + bytes / 700 GB/s: the fit returns both terms."""
    rows = [kf.KernelSample("stream", "aten::add", b, 2e-6 + b / 700e9, rank)
            for rank in range(4) for b in (1e3, 1e6, 1e7, 5e7, 1e8)]
    fit = kf.fit(rows, [1e-6, 1e-6, 2e-6])
    c = fit.classes["stream"]
    assert c.bytes_per_s == pytest.approx(700e9, rel=1e-6) and c.fixed_s == pytest.approx(2e-6, rel=1e-3)
    assert c.heldout_median == pytest.approx(0.0, abs=1e-9)
    assert kf.profile_terms(fit)["kernel_us"] == pytest.approx(2.0 + 1.0, rel=1e-3)


def test_small_kernels_do_not_determine_bandwidth():
    rows = [kf.KernelSample("stream", "aten::add", b, 2e-6 + b / 700e9, r) for r in range(2) for b in (1e3, 1e5, 1e6, 4e6)]
    assert kf.fit(rows, []).classes["stream"].bytes_per_s is None


def test_no_kernels_is_an_error(tmp_path):
    p = tmp_path / "t.json"
    p.write_text('{"traceEvents": []}')
    s, g = kf.read_traces([p])
    with pytest.raises(ZsimError, match="record_shapes"):
        kf.fit(s, g)
    p.write_text("not json")
    with pytest.raises(ZsimError, match="t.json"):
        kf.read_traces([p])


@pytest.fixture
def v100_fit(shared_data):
    paths = sorted(TRACES.glob("rank*.pt.trace.json.gz"))
    if not paths:
        pytest.skip(f"no Kineto traces in {TRACES}")
    return kf.fit(*kf.read_traces(paths))


def test_v100_trace_fit(v100_fit):
    """What the real trace determines: the fixed times (held out by rank parity) and the launch gap;
    not the HBM bandwidth (no kernel moves more than V100's 6 MiB L2)."""
    stream, reduce = v100_fit.classes["stream"], v100_fit.classes["reduce"]
    assert stream.samples > 1000 and stream.bytes_per_s is None and reduce.bytes_per_s is None
    assert 2e-6 < stream.fixed_s < 4e-6 and stream.heldout_median < 0.10
    assert reduce.fixed_s > 1.5 * stream.fixed_s  # a reduction costs about twice an elementwise kernel
    assert reduce.heldout_median < 0.25
    assert v100_fit.gaps > 100 and 0.5e-6 <= v100_fit.gap_s <= 2e-6
    assert "rng" not in v100_fit.classes  # no dropout in a DLRM trace


def test_v100_profiles_carry_the_fit(v100_fit):
    terms = kf.profile_terms(v100_fit)
    for system in ("dgx1", "dgx2"):
        c = load_cluster(system, 1).gpu.compute
        assert c.kernel_s * 1e6 == pytest.approx(terms["kernel_us"], abs=0.05)
        assert c.reduce_kernel_s * 1e6 == pytest.approx(terms["reduce_kernel_us"], abs=0.05)

"""The GPU phase fit on CUDA-event spans (issue 26; zsim.calibrate.span_timing, gpu_phase_fit): a span
lasts max(device work, host time), which the H200 runs show; the device terms come from the
device-bound spans, the host terms from the host-bound ones, apart; a poor fit names its causes and
--accept-poor-fit writes the host terms, which the simulator's host bound then uses. Out of sample:
fitted on h1024 and h4096, judged on the h2048 stage-3 run (held out before any data existed)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from zsim.calibrate.span_timing import SpanSample, combination, own_host_us
from zsim.cli import main
from zsim.compute.kernel_list import Kernel, KernelList
from zsim.compute.model import list_seconds
from zsim.compute.terms import ComputeTerms, GemmTerms
from zsim.fabric.cluster import load_cluster
from zsim.config.profiles import Profiles

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "data" / "device" / "20261126-h200" / "runs"
needs_data = pytest.mark.skipif(not (RUNS / "h2048").is_dir(), reason="no H200 device-check runs in data/device/")


class _Op:
    """The two facts `combination` reads of a plan op."""

    def __init__(self, flops: float):
        self.flops = flops
        self.kernels = None


def test_combination_tells_a_max_from_a_sum():
    # 10 µs of host, device work of FLOPs at 1e9 FLOP/s: 5 µs (host-bound) and 20 µs (device-bound) ops
    ops = [_Op(5e3), _Op(20e3)] * 3
    as_max = [(op, SpanSample(max(10e-6, op.flops / 1e9), 10e-6, 0.0)) for op in ops]
    as_sum = [(op, SpanSample(10e-6 + op.flops / 1e9, 10e-6, 0.0)) for op in ops]
    assert combination(as_max, 1e9)["combination"] == "max"
    assert combination(as_sum, 1e9)["combination"] == "sum"


def test_a_spans_own_host_time_leaves_out_what_is_nested_in_it():
    outer = {"ph": "X", "tid": 0, "ts": 0.0, "dur": 100.0, "args": {"host_us": 70.0}}
    inner = {"ph": "X", "tid": 0, "ts": 10.0, "dur": 30.0, "args": {"host_us": 25.0}}
    after = {"ph": "X", "tid": 0, "ts": 120.0, "dur": 5.0, "args": {"host_us": 4.0}}
    own = own_host_us([outer, inner, after])
    assert own == {id(outer): 45.0, id(inner): 25.0, id(after): 4.0}


def test_the_host_bound_counts_the_per_module_host_time():
    gemm = GemmTerms(efficiency=0.8, tile_bytes_per_s=1e13, k_overhead=0.0, fixed_s=0.0, hbm_efficiency=0.9)
    terms = ComputeTerms(sms=80, tiles=((128, 128),), gemm={"fp16": gemm}, hbm_efficiency=0.5, kernel_s=1e-6,
                         host_op_s=2e-6, host_module_s=500e-6)
    kl = KernelList("adds", (Kernel("add", "mem", bytes=1e3, count=4),))
    assert list_seconds(kl, terms, 1e14, 1e12, "fp16") == pytest.approx(500e-6 + 4 * 2e-6)


@needs_data
def test_the_h200_spans_show_the_max():
    from zsim.calibrate.span_timing import span_samples
    from zsim.trace.run_reader import read_run

    peak = load_cluster("hgx-h200", 1).gpu.peak_flops["bf16"]
    for name in ("h1024", "h4096", "h2048"):
        shown = combination(span_samples(read_run(RUNS / name), "hgx-h200"), peak)
        assert shown["combination"] == "max", (name, shown)
        assert shown["unexplained_by_sum"] > 3 * shown["unexplained_by_max"], (name, shown)


@needs_data
def test_heldout_stage3_run_does_not_get_worse():
    """Measured 2026-11-26 (benchmarks/gpu_span_holdout.py): median |error| 40.3%, sum of the ops -40.0%
    on h2048; 40.9% and -40.4% since the kernel lists drop the dropouts the runtime never launched
    (2026-11-27, commit c82e908: the host terms, fitted per launch, moved); 28.4% and -33.9% since the runs
    are rebuilt with the runtime's own kernel lists (model.kernels pytorch-2 and its per-segment step checks);
    the stage-3 run's host work around each fetched module (0.7-2 ms of idle GPU before its
    fwd/bwd spans) has no counterpart in the stage 1 and 2 runs the fit saw (docs/calibrate.md). The
    bounds are those figures rounded up to the next whole percent: a change that makes them worse fails."""
    from zsim.calibrate.gpu_phase_fit import heldout_run
    from zsim.trace.run_reader import read_run

    cluster = load_cluster("hgx-h200", 1)
    report = heldout_run(cluster, [read_run(RUNS / "h1024"), read_run(RUNS / "h4096")], read_run(RUNS / "h2048"),
                         "hgx-h200")
    assert report["ops"] == 72
    assert report["median_error"] <= 0.29, report
    assert abs(report["total_error"]) <= 0.34, report


@needs_data
def test_a_poor_gpu_fit_names_its_causes_and_is_written_when_accepted(tmp_path, capsys):
    inputs = [str(RUNS / "h1024"), str(RUNS / "h4096")]
    out = tmp_path / "h200.yaml"
    assert main(["calibrate", *inputs, "--profile", "hgx-h200", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert not out.exists()
    # with the runtime's own kernel lists (model.kernels pytorch-2) the in-sample median is 9.6%; the causes are
    # a term far from the base's and a host term on its bound, with the ops missed most (docs/device-check.md)
    assert "GPU phases: reduce_kernel_us = " in err and "more than 3× either way" in err
    assert "GPU phases: host_op_us = 0 us ended on the fit's bounds" in err
    assert "the ops missed most: " in err and "host-bound spans by a median" in err
    assert main(["calibrate", *inputs, "--profile", "hgx-h200", "-o", str(out), "--accept-poor-fit"]) == 0
    written = yaml.safe_load(out.read_text())
    # the fitted host terms are written as fitted: host_op_us on its bound (0, a cause named above) since the
    # runtime's own kernel lists, host_module_us the per-op cost
    assert written["compute"]["host_module_us"] > 0 and written["compute"]["host_op_us"] == 0
    assert "host_op_us = 0 us" in str(written["provenance"])
    assert written["provenance"]["phases"]["spans"]["combination"] == "max"
    assert "compute.host_module_us" in written["provenance"]["fitted_terms"]
    profiles, name = Profiles.from_environment().resolve_system(str(out))
    terms = load_cluster(name, 1, profiles).gpu.compute
    assert terms.host_module_s == pytest.approx(written["compute"]["host_module_us"] * 1e-6)

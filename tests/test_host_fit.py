"""The host compute fit (zsim.calibrate.host_fit): per-launch framework overhead, matmul rate and
bandwidth recovered from op times made with known terms; the optimizer's own two terms; refusals;
and the simulator pricing a host op the same way (zsim.engine.compute.compute_seconds)."""

import pytest

from zsim.calibrate.collectives import CalibrationError
from zsim.calibrate.host_fit import fit_compute, fit_optimizer
from zsim.scenario.scenario import load_scenario
from zsim.engine.compute import compute_seconds
from zsim.zero.ops import Op

OVERHEAD, RATE, BANDWIDTH = 90e-6, 30e9, 40e9  # s per launch, FLOP/s, B/s


def _t(launches, flops, nbytes):
    return launches * OVERHEAD + flops / RATE + nbytes / BANDWIDTH


def test_fit_compute_recovers_per_launch_overhead():
    ops = [(28, 1.1e8, 5.5e6), (34, 2.2e8, 1.1e7), (9, 0.0, 1e5), (13, 3.4e7, 1.3e6), (7, 6.7e7, 2.6e6),
           (28, 2.1e8, 5.5e6), (34, 4.2e8, 1.1e7)]
    fit, kept = fit_compute([(n, f, b, _t(n, f, b)) for n, f, b in ops])
    assert not kept
    assert fit.slopes[0] == pytest.approx(OVERHEAD, rel=1e-6)
    assert 1 / fit.slopes[1] == pytest.approx(RATE, rel=1e-6)
    assert 1 / fit.slopes[2] == pytest.approx(BANDWIDTH, rel=1e-6)


def test_fit_compute_refuses_too_few_ops_and_flat_times():
    with pytest.raises(CalibrationError, match="distinct compute ops"):
        fit_compute([(28, 1e8, 5e6, 0.01), (34, 2e8, 1e7, 0.02)])
    flat = [(n, f, 1e6, 0.001 * n) for n, f in ((1, 1e8), (2, 2e8), (3, 4e8), (4, 1e8), (5, 3e8), (6, 5e8))]
    with pytest.raises(CalibrationError, match="not determined"):
        fit_compute(flat)


def test_bandwidth_the_ops_do_not_determine_is_kept_from_the_base():
    """Times that do not grow with the ops' bytes (noise makes them shrink a little): the bandwidth is
    kept at the base's and said so, the residuals are those of the model with the kept term (not
    hidden), and without a base it is refused."""
    ops = [(28, 1.1e8, 5.5e6), (34, 2.2e8, 5.6e6), (9, 0.0, 5.7e6), (13, 3.4e7, 5.8e6), (7, 6.7e7, 5.9e6),
           (28, 2.1e8, 6.0e6)]
    rows = [(n, f, b, n * OVERHEAD + f / RATE + (6.1e6 - b) * 1e-11) for n, f, b in ops]
    fit, kept = fit_compute(rows, base_bytes_per_s=8e9)
    assert kept and 1 / fit.slopes[2] == pytest.approx(8e9)
    predicted = [n * fit.slopes[0] + f * fit.slopes[1] + b * fit.slopes[2] for n, f, b in ops]
    assert fit.errors == pytest.approx([p / r[3] - 1 for p, r in zip(predicted, rows)])
    with pytest.raises(CalibrationError, match="memory_GBps"):
        fit_compute(rows)


def test_matmul_rate_above_the_probes_is_held_at_the_probe():
    """The probe timed torch.mm on the run's own GEMM shapes with every rank at once: a fitted rate above it
    is the fit trading FLOPs for per-op overhead. It is held at the probe's, named, and the overhead and
    bandwidth are fitted again around it; a probe faster than the data leaves the fitted rate alone."""
    ops = [(28, 1.1e8, 5.5e6), (34, 2.2e8, 1.1e7), (9, 0.0, 1e5), (13, 3.4e7, 1.3e6), (7, 6.7e7, 2.6e6),
           (28, 2.1e8, 5.5e6), (34, 4.2e8, 1.1e7)]
    rows = [(n, f, b, _t(n, f, b)) for n, f, b in ops]
    why: dict[str, str] = {}
    fit, kept = fit_compute(rows, base_bytes_per_s=8e9, base_overhead_s=3e-6, base_flops_per_s=RATE * 0.8, reasons=why)
    assert "matmul_GFLOPS" in kept and 1 / fit.slopes[1] == pytest.approx(RATE * 0.8)
    assert "above the probe's rate" in why["matmul_GFLOPS"] and "not determined" in why["memory_GBps"]
    # the overhead is fitted again around it (these ops' bytes grow with their FLOPs, so the slower rate leaves
    # the bandwidth nothing to explain: kept at the base's, and named)
    assert "op_overhead_us" not in kept and 0 < fit.slopes[0] < OVERHEAD and kept == ("matmul_GFLOPS", "memory_GBps")
    predicted = [n * fit.slopes[0] + f * fit.slopes[1] + b * fit.slopes[2] for n, f, b in ops]
    assert sum(predicted) == pytest.approx(sum(r[3] for r in rows), rel=1e-9)  # level matched over the kept rate
    fit, kept = fit_compute(rows, base_bytes_per_s=8e9, base_overhead_s=3e-6, base_flops_per_s=RATE * 2)
    assert not kept and 1 / fit.slopes[1] == pytest.approx(RATE, rel=1e-6)


def test_fit_optimizer_two_terms_or_none():
    rows = [(n, b, n * 60e-6 + b / 19e9) for n, b in ((56, 0.0), (80, 0.0), (1, 1.9e6), (1, 1e7), (2, 1.3e7), (2, 7e7))]
    fit = fit_optimizer(rows)
    assert fit.slopes[0] == pytest.approx(60e-6, rel=1e-6) and 1 / fit.slopes[1] == pytest.approx(19e9, rel=1e-6)
    assert fit_optimizer(rows[:2]) is None  # too few distinct ops: the general terms apply


def test_simulator_prices_host_ops_per_launch():
    scenario = load_scenario("scenarios/calibrate/gpt-tiny-a.yaml")
    host, gpu = scenario.cluster.host, scenario.cluster.gpu
    op = Op(name="optimizer/step", step=0, micro_batch=0, stream="compute", hbm_bytes=1e6)
    assert compute_seconds(op, gpu, "fp32", host) == pytest.approx(1e6 / host.optimizer_bytes_per_s + host.optimizer_overhead_s)
    layer = Op(name="fwd/x", step=0, micro_batch=0, stream="compute", flops=1e9)
    assert compute_seconds(layer, gpu, "fp32", host) == pytest.approx(1e9 / gpu.peak_flops["fp32"] + host.op_overhead_s)


def test_gemm_tables_cannot_calibrate_a_host_even_beside_a_run(tmp_path, capsys):
    """A GEMM table next to a (simulated) host run is refused, not silently left out of the fit."""
    import json

    from zsim import api
    from zsim.cli import main
    from zsim.report.trace_writer import simulated_trace

    run = tmp_path / "host.trace.json"
    run.write_text(json.dumps(simulated_trace(api.simulate(api.load("scenarios/calibrate/gpt-tiny-a.yaml")))))
    table = tmp_path / "gemm.csv"
    table.write_text("M,N,K,time_ms\n" + "".join(f"{m},{m},{m},{m / 1000}\n" for m in (256, 512, 1024, 2048)))
    out = tmp_path / "host.yaml"
    code = main(["calibrate", str(table), str(run), "--profile", "dev-2core", "-o", str(out), "--fit", "compute"])
    assert code == 2 and not out.exists()
    assert "GEMM tables" in capsys.readouterr().err


def test_module_overhead_is_fitted_with_the_launch_overhead_held_at_the_probe():
    """Ops made with a per-op cost c beside the per-launch one: holding the launch overhead at the probe's
    (which measures it), the fit recovers c, the rate and the bandwidth; fitting both overheads freely
    is what let a layer's many launches and an embedding's few trade against each other."""
    module = 450e-6
    ops = [(28, 1.1e8, 5.5e6), (34, 2.2e8, 1.1e7), (9, 0.0, 1e5), (13, 3.4e7, 1.3e6), (7, 6.7e7, 2.6e6),
           (28, 2.1e8, 5.5e6), (34, 4.2e8, 1.1e7)]
    rows = [(n, f, b, module + _t(n, f, b)) for n, f, b in ops]
    why: dict[str, str] = {}
    fit, kept = fit_compute(rows, base_bytes_per_s=8e9, base_overhead_s=OVERHEAD, base_flops_per_s=RATE * 4,
                            hold_overhead=True, reasons=why)
    assert kept == ("op_overhead_us",) and fit.slopes[0] == OVERHEAD and "held at the probe's" in why["op_overhead_us"]
    assert fit.intercept == pytest.approx(module, rel=1e-6) and 1 / fit.slopes[1] == pytest.approx(RATE, rel=1e-6)
    assert 1 / fit.slopes[2] == pytest.approx(BANDWIDTH, rel=1e-6) and max(map(abs, fit.errors)) < 1e-9


def test_simulator_adds_the_module_overhead_to_compute_ops_not_the_optimizers():
    import dataclasses

    scenario = load_scenario("scenarios/calibrate/gpt-tiny-a.yaml")
    gpu = scenario.cluster.gpu
    host = dataclasses.replace(scenario.cluster.host, module_overhead_s=450e-6)
    layer = Op(name="fwd/x", step=0, micro_batch=0, stream="compute", flops=1e9)
    assert compute_seconds(layer, gpu, "fp32", host) == pytest.approx(
        1e9 / gpu.peak_flops["fp32"] + host.op_overhead_s + 450e-6)
    step = Op(name="optimizer/step", step=0, micro_batch=0, stream="compute", hbm_bytes=1e6)
    assert compute_seconds(step, gpu, "fp32", host) == pytest.approx(
        1e6 / host.optimizer_bytes_per_s + host.optimizer_overhead_s)


def test_a_collectives_shared_speed_is_read_off_its_overlap():
    """A 10 ms transfer, 8 ms of it beside compute, that takes 3.6 ms alone: 2 ms alone, then 1.6 ms of
    work in 8 ms (speed 0.2). Under half overlapped, or an impossible speed: no sample."""
    from zsim.calibrate.core_sharing import gloo_speed_samples

    e = {"ph": "X", "ts": 0.0, "dur": 10_000.0, "tid": 1, "args": {"op": "reduce_scatter", "last_arrival_ts": 0.0}}
    assert gloo_speed_samples(e, [(2_000.0, 10_000.0)], 3_600.0) == pytest.approx(0.2)
    assert gloo_speed_samples(e, [(6_000.0, 10_000.0)], 3_600.0) is None  # 40% overlapped
    assert gloo_speed_samples(e, [(2_000.0, 10_000.0)], 1_000.0) is None  # faster alone than its un-overlapped part

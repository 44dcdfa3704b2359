"""Round trip (issue 10): simulate with a profile, export the simulated traces, calibrate from them
starting from a deliberately wrong profile, and get the first profile's terms back within 2%.

Every term the traces determine must come back; terms they cannot determine (here: the launch floor,
which one process per GPU never hits, and the element-wise paths, which 16-byte-aligned buckets never
take) must be reported as kept from the base, not invented."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from zsim.calibrate.nccl_fit import values_of
from zsim.cli import main
from zsim.fabric.cluster import load_cluster
from zsim.config.profiles import Profiles, builtin_folder
from zsim.scenario.scenario import build_scenario
from zsim.engine.simulation import simulate
from zsim.report.trace_writer import simulated_trace

WRONG = {"efficiency: {LL: 0.444, LL128: {broadcast: 0.9375, reduce: 0.9375, all_gather: 0.458, reduce_scatter: 0.274,\n"
         "                                  all_reduce: 0.526}, Simple: 0.813}":
         "efficiency: {LL: 0.3, LL128: {broadcast: 0.5, reduce: 0.5, all_gather: 0.7, reduce_scatter: 0.6, "
         "all_reduce: 0.6}, Simple: 0.6}",
         "latency_us: {LL: 7.383, LL128: 2.827, Simple: 6.826}": "latency_us: {LL: 8, LL128: 40, Simple: 10}",
         "step_latency_us: {LL: 0.195, LL128: 1.709, Simple: 0.890}": "step_latency_us: {LL: 1, LL128: 1, Simple: 2}"}


def simulated_traces(folder: Path) -> list[Path]:
    """Stage 0 and 3 runs of three widths on one DGX-2 node: all-reduces, all-gathers and
    reduce-scatters from 4 B to 100 MB, in LL, LL128 and Simple."""
    files = []
    for stage in (0, 3):
        for hidden in (256, 768, 2048):
            data = {"model": {"layers": 2, "hidden": hidden, "heads": 8, "seq_len": 256, "vocab": 5000,
                              "micro_batch": 1},
                    "parallel": {"dp": 16, "mp": 1}, "zero": {"stage": stage, "reduce_bucket_elements": 2_000_000},
                    "precision": {"dtype": "fp16"}, "hardware": {"profile": "dgx2", "nodes": 1}, "run": {"steps": 1}}
            path = folder / f"stage{stage}-h{hidden}.trace.json"
            path.write_text(json.dumps(simulated_trace(simulate(build_scenario(data)))))
            files.append(path)
    return files


def test_calibrating_a_simulation_gives_back_its_profile(tmp_path, capsys):
    files = simulated_traces(tmp_path)
    text = (builtin_folder() / "dgx2.yaml").read_text()
    for right, wrong in WRONG.items():
        assert right in text, "the DGX-2 profile changed: update WRONG"
        text = text.replace(right, wrong)
    text = re.sub(r"unaligned_reduce_GBps: [\d.]+", "unaligned_reduce_GBps: 60", text)
    (tmp_path / "wrong.yaml").write_text(text)
    out = tmp_path / "recovered.yaml"
    code = main(["calibrate", *map(str, files), "--profile", str(tmp_path / "wrong.yaml"), "-o", str(out),
                 "--fit", "collectives", "--json", "-"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    truth = values_of(load_cluster("dgx2", 1).nccl)
    profiles, name = Profiles.from_environment().with_system_file(out)  # the written file, as --profile FILE
    recovered = values_of(load_cluster(name, 1, profiles).nccl)
    fitted = report["collectives"]["fitted"]
    assert {"efficiency.LL", "efficiency.LL128.all_reduce", "efficiency.LL128.all_gather",
            "efficiency.LL128.reduce_scatter", "efficiency.Simple", "latency_us.LL", "latency_us.LL128",
            "latency_us.Simple", "step_latency_us.LL", "step_latency_us.Simple"} <= set(fitted)
    for name in fitted:
        if truth[name] == 0.0:
            assert recovered[name] < 0.02, name  # µs: a zero term comes back as (nearly) zero
        else:
            assert recovered[name] == pytest.approx(truth[name], rel=0.02), name
    kept = set(report["collectives"]["kept_from_base"])
    # training runs no broadcast or reduce, and launches one GPU per process
    assert kept == {"launch_us", "unaligned_copy_GBps", "unaligned_reduce_GBps", "efficiency.LL128.broadcast",
                    "efficiency.LL128.reduce"}
    assert recovered["efficiency.LL128.broadcast"] == 0.5  # kept from the base, not invented
    written = yaml.safe_load(out.read_text())
    assert set(written["provenance"]["collectives"]["kept_from_base"]) == kept
    assert written["nccl"]["tuner"] == "2.5"  # the base's release: the fit depends on its choices
    assert recovered["unaligned_reduce_GBps"] == pytest.approx(60.0, rel=1e-3)  # kept, not invented


def test_phase_timings_give_back_the_memory_bound_compute_terms(tmp_path, capsys):
    """The compute half: the same simulated traces' compute ops, lined up with plans rebuilt on a
    profile whose memory-bound terms are wrong, give back the DGX-2's V100 terms; host-bound ops
    (small kernels waiting for the framework) are left out and counted, not fitted."""
    files = simulated_traces(tmp_path)
    wrong = (builtin_folder() / "dgx2.yaml").read_text() + (
        "\ncompute: {hbm_efficiency: 0.87, kernel_us: 8.0, reduce_kernel_us: 12.0}\n")
    (tmp_path / "wrong.yaml").write_text(wrong)
    out = tmp_path / "recovered.yaml"
    code = main(["calibrate", *map(str, files), "--profile", str(tmp_path / "wrong.yaml"), "-o", str(out),
                 "--fit", "compute", "--json", "-"])
    assert code == 0
    phases = json.loads(capsys.readouterr().out)["phases"]
    assert phases["kept_from_base"] == [] and phases["host_bound_ops_left_out"] > 0
    assert phases["heldout"]["median_error"] < 0.02
    profiles, name = Profiles.from_environment().with_system_file(out)
    truth, recovered = load_cluster("dgx2", 1).gpu.compute, load_cluster(name, 1, profiles).gpu.compute
    assert recovered.hbm_efficiency == pytest.approx(truth.hbm_efficiency, rel=0.02)
    assert recovered.kernel_s == pytest.approx(truth.kernel_s, rel=0.02)
    assert recovered.reduce_kernel_s == pytest.approx(truth.reduce_kernel_s, rel=0.02)
    assert recovered.gemm == truth.gemm  # phases cannot separate GEMM efficiency: kept


def test_one_shape_cannot_determine_the_compute_terms(tmp_path, capsys):
    """One small run has too few distinct GPU-bound ops for three terms: refused, nothing written."""
    files = simulated_traces(tmp_path)[:1]
    out = tmp_path / "recovered.yaml"
    code = main(["calibrate", str(files[0]), "--profile", "dgx2", "-o", str(out), "--fit", "compute"])
    assert code == 2 and not out.exists()
    assert "cannot determine" in capsys.readouterr().err

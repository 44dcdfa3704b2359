"""`zsim replay`: the measures it compares (on hand-made events, where the answer is known), and one
real 2-rank run of the runtime replayed end to end: every op lines up, model states are exact, the
side-by-side Perfetto file holds both runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from zsim.calibrate import replay as rp
from zsim.cli import main
from zsim.trace.schema import complete, counter

ROOT = Path(__file__).resolve().parents[1]


def ev(name, stream, ts, dur, step=0, mb=0, **args):
    return complete(name, 0, stream, ts, dur, step=step, micro_batch=mb, **args)


def test_exposed_comm_is_comm_time_without_compute():
    events = [ev("fwd/layer.0", "compute", 0, 100), ev("bwd/layer.0", "compute", 150, 100),
              ev("all_reduce/grads.bucket.0", "comm", 80, 100, op="all_reduce", bytes=8, group=[0, 1]),
              ev("all_reduce/grads.bucket.1", "comm", 240, 60, op="all_reduce", bytes=8, group=[0, 1])]
    # comm covers [80, 180) and [240, 300); compute [0, 100) and [150, 250): exposed 50 + 50 µs
    assert rp.exposed_comm_seconds(events)[0] == pytest.approx(100e-6)


def test_step_time_runs_from_optimizer_end_to_optimizer_end():
    events = [ev("fwd/layer.0", "compute", 10, 90), ev("optimizer/step", "compute", 100, 50, step=0),
              ev("fwd/layer.0", "compute", 150, 100, step=1), ev("optimizer/step", "compute", 300, 100, step=1)]
    assert rp.step_seconds(events) == pytest.approx([140e-6, 250e-6])
    assert rp.judged([1.0, 2.0, 3.0]) == [2.0, 3.0]


def test_time_between_steps_belongs_to_the_harness():
    """The runtime makes the next batch and writes its trace between steps: not part of a step
    (the runtime's own step_seconds time train_step alone)."""
    events = [ev("fwd/layer.0", "compute", 10, 90), ev("optimizer/step", "compute", 100, 50, step=0),
              ev("fwd/layer.0", "compute", 170, 80, step=1), ev("optimizer/step", "compute", 300, 100, step=1)]
    assert rp.between_steps_us(events) == {1: pytest.approx(20.0)}
    assert rp.step_seconds(events) == pytest.approx([140e-6, 230e-6])


def test_alignment_lists_what_does_not_line_up():
    measured = [ev("all_gather/params.layer.0", "comm", 0, 10, op="all_gather", bytes=100, group=[0, 1]),
                ev("all_gather/params.layer.0", "comm", 50, 10, op="all_gather", bytes=100, group=[0, 1]),
                ev("fwd/layer.0", "compute", 10, 10), ev("wait/params.layer.0", "compute", 20, 5)]
    simulated = [ev("all_gather/params.layer.0", "comm", 0, 10, op="all_gather", bytes=128, group=[0, 1]),
                 ev("fwd/layer.0", "compute", 10, 10), ev("fwd/head", "compute", 20, 10)]
    a = rp.align(measured, simulated)
    assert len(a.pairs) == 2  # the first gather (occurrence 0) and the forward; waiting spans are not ops
    assert a.measured_only == [("all_gather/params.layer.0", 0, 0, 1)]
    assert a.simulated_only == [("fwd/head", 0, 0, 0)]
    assert a.bytes_differ == [(("all_gather/params.layer.0", 0, 0, 0), 100, 128)]


def test_collective_time_excludes_waiting():
    e = ev("reduce_scatter/grads.bucket.0", "comm", 100, 500, op="reduce_scatter", bytes=8, group=[0, 1],
           last_arrival_ts=400)
    assert rp.op_seconds(e) == pytest.approx(200e-6)


def test_peak_memory_per_category():
    events = [counter("memory", 0, 0, {"params": 10, "grads": 0}), counter("memory", 0, 5, {"params": 10, "grads": 7}),
              counter("memory", 0, 9, {"params": 4, "grads": 3})]
    assert rp.peak_memory(events) == {"params": 10, "grads": 7}


def test_replay_rejects_damaged_traces(tmp_path, capsys):
    from tests.test_calibrate import measured_run

    folder = measured_run(tmp_path / "run")
    (folder / "rank0.trace.json").write_text("{\"schema\": ")
    assert main(["replay", str(folder), "--profile", "dgx2", "-o", str(tmp_path / "out")]) == 2
    assert "rank0.trace.json: not valid JSON" in capsys.readouterr().err


@pytest.mark.slow
def test_real_run_replays_op_for_op(tmp_path, capsys):
    """2 gloo ranks, stage 2, 2 micro-batches: the simulator's plan and the runtime's trace line up one
    to one (name, step, micro-batch, bytes), and the model states per rank are exact."""
    host = ROOT / "hwprofiles" / "hosts" / "dev-2core.yaml"
    if not host.is_file():
        pytest.skip("no host profile of this machine (hwprofiles/hosts/dev-2core.yaml)")
    run = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "zsim.runtime", "--ranks", "2", "--stage", "2", "--grad-accum", "2",
                           "--steps", "2", "--precision", "fp32", "--model",
                           str(ROOT / "scenarios" / "calibrate" / "gpt-tiny-a.yaml"), "-o", str(run)],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert main(["replay", str(run), "--profile", "dev-2core", "-o", str(tmp_path / "out"), "--json", "-"]) == 0
    report = json.loads(capsys.readouterr().out)
    a = report["alignment"]
    assert a["lined_up"] > 0 and not a["measured_only"] and not a["simulated_only"] and not a["bytes_differ"]
    assert all(v["exact"] for v in report["model_states_bytes"].values())
    assert report["step_seconds"]["measured"] > 0 and report["step_seconds"]["simulated"] > 0
    doc = json.loads((tmp_path / "out" / "replay.trace.json").read_text())
    assert {e["pid"] for e in doc["traceEvents"]} == {0, 1, 1000}
    assert report["caution"] is None  # gloo on a host profile: the pairing calibrate accepts
    # the same gloo run on a GPU system runs (a what-if), and says it compares two different machines
    assert main(["replay", str(run), "--profile", "dgx2", "-o", str(tmp_path / "gpu")]) == 0
    assert "caution   the run's collectives ran on gloo, the profile models NCCL on GPUs" in capsys.readouterr().out


def test_kineto_trace_driven_replay_reproduces_the_dlrm_step(shared_data, tmp_path, capsys):
    """The dependencies inferred from the trace's timing, with the measured transfers put back, give
    the measured span of the 8×V100 DLRM step; on the DGX-1 profile only the collectives change."""
    from zsim.calibrate.kineto_replay import replay_kineto
    from zsim.trace.kineto_run import read_kineto

    run = read_kineto([shared_data / "kineto/dlrm-8xv100"])
    identity = replay_kineto(run, None)
    assert identity["simulated_span_s"] == pytest.approx(identity["measured_span_s"], rel=0.01)
    assert main(["replay", str(shared_data / "kineto/dlrm-8xv100"), "--profile", "dgx1", "--trace-driven",
                 "-o", str(tmp_path), "--json", "-"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert len(report["collectives"]) == 8 and report["span_seconds"]["simulated"] > 0
    pids = {e["pid"] for e in json.loads((tmp_path / "replay.trace.json").read_text())["traceEvents"]}
    assert pids == set(range(8)) | set(range(1000, 1008))


def test_kineto_replay_needs_trace_driven(shared_data, tmp_path, capsys):
    assert main(["replay", str(shared_data / "kineto/dlrm-8xv100"), "--profile", "dgx1", "-o", str(tmp_path)]) == 2
    assert "--trace-driven" in capsys.readouterr().err

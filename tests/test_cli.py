"""The CLI end to end, in real subprocesses: outputs, JSON keys, exit codes."""

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT


def zsim(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "zsim.cli", *args], capture_output=True, text=True, cwd=cwd)


@pytest.fixture(scope="module")
def flagship(tmp_path_factory):
    out = tmp_path_factory.mktemp("flagship")
    proc = zsim("run", "scenarios/1T-1024gpu.yaml", "-o", str(out), "--json", "-", "--stats")
    assert proc.returncode == 0, proc.stderr
    return out, json.loads(proc.stdout), proc.stderr


def test_flagship_writes_outputs_and_facts(flagship):
    out, f, text = flagship
    assert (out / "memory.png").stat().st_size > 10_000
    trace = json.loads((out / "trace.json").read_text())
    assert trace["schema"] == "zsim-trace/1" and trace["metadata"]["source"] == "simulated"
    names = {e["name"] for e in trace["traceEvents"]}
    assert {"fwd/layer.0", "bwd/layer.127", "recompute/layer.5", "optimizer/step",
            "all_gather/params.layer.3", "reduce_scatter/grads.layer.3", "memory"} <= names
    tids = {e["tid"] for e in trace["traceEvents"] if e["ph"] == "X"}
    assert tids == {0, 1}  # compute and comm tracks
    assert json.loads((out / "result.json").read_text())["fits"] is True
    assert "FITS" in text and "TFLOPS/GPU" in text and "stats" in text and "simpy events" in text


def test_flagship_matches_the_papers_formulas(flagship):
    _, f, _ = flagship
    psi = f["model"]["params_per_mp_rank"]
    nd = f["layout"]["dp"]
    assert f["model"]["params"] == 1_008_012_544_000  # Narayanan et al. 2021 Table 1: 1008B (seq 1024 here)
    # ZeRO stage 3: 16Ψ/Nd of model states per GPU (Ψ per MP rank, largest partition)
    assert f["memory"]["model_states"]["total"] == 16 * -(-psi // nd)
    # 3Ψ of DP traffic per step, to the byte (fp16 elements × 2 bytes)
    assert f["comm"]["dp_volume_bytes_per_step"] == 3 * 2 * psi
    assert f["comm"]["dp_volume_over_psi"] == 3.0
    assert f["memory"]["peak_bytes"] <= f["memory"]["capacity_bytes"]
    assert 0 < f["throughput"]["percent_of_peak"] < 100


def test_json_to_file_and_set_override(tmp_path):
    path = tmp_path / "r.json"
    proc = zsim("run", "scenarios/paper/7.5B-64gpu-stage3.yaml", "--set", "zero.stage=2", "--no-plot",
                "-o", str(tmp_path / "o"), "--json", str(path))
    assert proc.returncode == 0, proc.stderr
    f = json.loads(path.read_text())
    assert f["zero"]["stage"] == 2 and f["comm"]["dp_volume_over_psi"] == 2.0
    assert "FITS" in proc.stdout


def test_oom_exits_3_with_the_moment_and_category(tmp_path):
    proc = zsim("run", "scenarios/paper/7.5B-64gpu-stage1.yaml", "--no-plot", "-o", str(tmp_path))
    assert proc.returncode == 3
    assert "OOM" in proc.stdout and "zsim: out of memory at t = " in proc.stderr
    assert "Traceback" not in proc.stderr


def test_memory_calculator_json():
    proc = zsim("memory", "--params", "7.5e9", "--dp", "64", "--stage", "2", "--json", "-")
    assert proc.returncode == 0
    table = json.loads(proc.stdout)
    assert round(table["stages"]["2"]["total"] / 1e9, 1) == 16.6


def test_memory_calculator_bad_input_exits_2():
    proc = zsim("memory", "--params", "lots", "--dp", "64")
    assert proc.returncode == 2 and "argument --params: 'lots': expected a positive count" in proc.stderr and "Traceback" not in proc.stderr
    assert zsim("memory", "--params", "1e9", "--dp", "0").returncode == 2


@pytest.mark.parametrize("command", ["run", "memory"])
def test_help(command):
    proc = zsim(command, "--help")
    assert proc.returncode == 0 and "usage: zsim " + command in proc.stdout


def test_trace_collectives_carry_schema_args(flagship):
    out, _, _ = flagship
    trace = json.loads((out / "trace.json").read_text())
    ag = next(e for e in trace["traceEvents"] if e["name"] == "all_gather/params.layer.0")
    assert ag["cat"] == "comm" and ag["args"]["op"] == "all_gather" and ag["args"]["dtype"] == "fp16"
    assert ag["args"]["group"] == list(range(0, 1024, 16))  # rank 0's DP group: same mp_rank, every node
    mp = next(e for e in trace["traceEvents"] if e["name"] == "all_reduce/mp.layer.0")
    assert mp["cat"] == "compute" and mp["args"]["group"] == list(range(16))

"""The CLI end to end, in real subprocesses: outputs, JSON keys, exit codes."""

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from zsim.trace.schema import group_ranks


def zsim(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "zsim.cli", *args], capture_output=True, text=True, cwd=cwd)


@pytest.fixture(scope="module")
def flagship(tmp_path_factory):
    out = tmp_path_factory.mktemp("flagship")
    proc = zsim("run", "scenarios/1T-1024gpu.yaml", "-o", str(out), "--json", "-", "--stats", "--plot", "wait")
    assert proc.returncode == 0, proc.stderr
    return out, json.loads(proc.stdout), proc.stderr


def test_flagship_writes_outputs_and_facts(flagship):
    out, f, text = flagship
    assert (out / "memory.png").stat().st_size > 10_000
    trace = json.loads((out / "trace.json").read_text())
    assert trace["schema"] == "zsim-trace/1" and trace["metadata"]["source"] == "simulated"
    names = {e["name"] for e in trace["traceEvents"]}
    assert {"fwd/layer.0", "bwd/layer.127", "recompute/layer.5", "optimizer/step",
            "all_gather/params.layer.3", "reduce_scatter/grads.bucket.3", "memory"} <= names
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
    # 3Ψ of DP traffic per step, to the byte (fp16 elements × 2 bytes), plus the optimizer's two
    # 4-byte all-reduces (overflow flag, gradient norm; an all-reduce of S counts 2S)
    assert f["comm"]["dp_volume_bytes_per_step"] == 3 * 2 * psi + 2 * 2 * 4
    assert f["comm"]["dp_volume_over_psi"] == pytest.approx(3.0, abs=1e-6)
    assert f["memory"]["peak_bytes"] <= f["memory"]["capacity_bytes"]
    assert 0 < f["throughput"]["percent_of_peak"] < 100


def test_json_to_file_and_set_override(tmp_path):
    path = tmp_path / "r.json"
    proc = zsim("run", "scenarios/paper/7.5B-64gpu-stage3.yaml", "--set", "zero.stage=2", "--no-plot",
                "-o", str(tmp_path / "o"), "--json", str(path))
    assert proc.returncode == 0, proc.stderr
    f = json.loads(path.read_text())
    assert f["zero"]["stage"] == 2 and f["comm"]["dp_volume_over_psi"] == pytest.approx(2.0, abs=1e-6)
    assert "FITS" in proc.stdout
    # the title is the file's description (stage 3): what the command line changed is said under it
    assert f["scenario"]["overrides"] == ["zero.stage=2"] and "\n  overrides zero.stage=2 " in proc.stdout


def test_oom_exits_3_with_the_moment_and_category(tmp_path):
    proc = zsim("run", "scenarios/paper/7.5B-64gpu-stage1.yaml", "--no-plot", "-o", str(tmp_path))
    assert proc.returncode == 3
    assert "OOM" in proc.stdout and "zsim: out of memory at t = " in proc.stderr
    assert "run on as if the GPU had room, the step peaks at" in proc.stdout
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
    meta = trace["metadata"]
    assert group_ranks(ag["args"], meta) == list(range(0, 1024, 16))  # rank 0's DP group: same mp_rank, every node
    mp = next(e for e in trace["traceEvents"] if e["name"] == "all_reduce/mp.layer.0")
    assert mp["cat"] == "compute" and group_ranks(mp["args"], meta) == list(range(16))
    assert ag["args"]["group"] == "dp"  # the ranks are listed once, in metadata.groups, not per event


def test_collective_prints_the_nccl_tests_table():
    proc = zsim("collective", "--hw", "dgx2", "--nodes", "1", "--gpus", "12", "--op", "all_reduce",
                "-b", "8", "-e", "8G", "-f", "2")
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if line and not line.startswith("#")]
    assert len(rows) == 31 and rows[0][:3] == ["8", "2", "float"] and rows[-1][0] == str(8 << 30)
    assert float(rows[-1][5]) > 100  # busbw at 8 GiB, GB/s
    assert {r[6].split("/")[1] for r in rows} == {"LL", "LL128", "Simple"}


def test_collective_json_and_other_ops():
    proc = zsim("collective", "--profile", "dgx-h100", "--nodes", "2", "--gpus", "16", "--op", "all_to_all",
                "-b", "1M", "-e", "1G", "-f", "1024", "--json", "-")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert [r["size"] for r in rows] == [1 << 20, 1 << 30]
    assert set(rows[0]) == {"size", "count", "dtype", "time_us", "algbw", "busbw", "algorithm",
                            "op", "nodes", "gpus", "gpus_per_process"}  # the run: the rows read back as a table


@pytest.mark.parametrize("args,message", [
    (["-b", "8X"], "-b/--minbytes: '8X'"),
    (["--gpus", "20"], "--gpus 20"),
    (["-b", "1G", "-e", "1M"], "smaller than -b"),
    (["--profile", "dgx3"], "did you mean 'dgx2'"),
])
def test_collective_bad_input_is_one_line_and_exit_2(args, message):
    base = {"--profile": "dgx2", "--gpus": "12", "--op": "all_reduce"}
    for flag, value in zip(args[::2], args[1::2]):
        base[flag] = value
    extra = [a for kv in base.items() for a in kv]
    proc = zsim("collective", *extra, *[a for a in args if a not in base and a not in base.values()])
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


def test_nccl_fit_reports_profile_and_residuals(shared_data):
    proc = zsim("nccl-fit", str(shared_data / "nccl-tests/dgx2-v100-12gpu"), "--profile", "dgx2", "--gpus", "12",
                "-g", "12", "--json", "-")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert 0.75 < out["values"]["efficiency.Simple"] < 0.9
    assert {r["op"] for r in out["residuals"]} == {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce"}
    assert all(med <= 0.10 for med, _ in out["summary"].values())


def test_nccl_fit_without_tables_says_so(tmp_path):
    proc = zsim("nccl-fit", str(tmp_path), "--hw", "dgx2", "--gpus", "12")
    assert proc.returncode == 2 and "no nccl-tests tables" in proc.stderr


@pytest.mark.parametrize("args", [["maxsize", "--dp", "0", "--mp", "16"], ["nccl-fit", ".", "--hw", "dgx2", "--gpus", "12", "-g", "0"],
                                  ["collective", "--hw", "dgx2", "--gpus", "-4", "--op", "all_reduce"]])
def test_non_positive_counts_are_rejected_by_the_parser(args):
    proc = zsim(*args)
    assert proc.returncode == 2 and "expected a positive integer" in proc.stderr and "Traceback" not in proc.stderr


def test_nccl_fit_with_an_impossible_layout_is_one_line(shared_data):
    proc = zsim("nccl-fit", str(shared_data / "nccl-tests/dgx2-v100-12gpu"), "--hw", "dgx2", "--gpus", "20")
    assert proc.returncode == 2 and "--gpus 20" in proc.stderr and "Traceback" not in proc.stderr


def test_a_forced_algorithm_that_does_not_apply_is_said():
    """NCCL has trees for all_reduce only: a forced tree all_gather runs as a ring, and the table says so."""
    gather = zsim("collective", "--profile", "dgx2", "--nodes", "2", "--gpus", "32", "--op", "all_gather",
                  "--algorithm", "tree", "-b", "1M", "-e", "1M")
    assert gather.returncode == 0 and "ring/" in gather.stdout
    assert "# --algorithm tree applies to all_reduce across nodes; all_gather on 32 GPUs" in gather.stdout
    reduce = zsim("collective", "--profile", "dgx2", "--nodes", "2", "--gpus", "32", "--op", "all_reduce",
                  "--algorithm", "tree", "-b", "4M", "-e", "4M")
    assert "tree/" in reduce.stdout and "applies to" not in reduce.stdout


@pytest.mark.parametrize("args, message", [
    (["--scenario", "scenarios/paper/C1-100B-400gpu.yaml", "--set", "zero.stage=9"],
     "--set 'zero.stage=9' (on scenarios/paper/C1-100B-400gpu.yaml): zero.stage: must be an integer <= 3 (got 9)"),
    # was "not even one layer fits", then blamed on the file
    (["--scenario", "scenarios/paper/C1-100B-400gpu.yaml", "--set", "model.layers=abc"],
     "model.layers: must be an integer (got 'abc')"),
    (["--scenario", "scenarios/paper/C1-100B-400gpu.yaml", "--stage", "0", "--batch", "64"],
     "--stage, --batch describe a shape of its own; with --scenario change the scenario's keys with --set"),
    (["--dp", "64", "--gpu-mem", "32GB", "--set", "zero.stage=2"], "--set changes a key of --scenario"),
    (["--dp", "64", "--gpu-mem", "32GB", "--hidden", "4096"], "--hidden describes the shape of a full-memory search"),
])
def test_maxsize_refuses_what_its_mode_would_ignore(args, message):
    """An option the chosen mode does not read, or a bad key of --scenario, is exit 2 before any search."""
    proc = zsim("maxsize", *args)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("args, message", [
    (["collective", "--profile", "dgx2", "--gpus", "16", "--op", "all_reduce", "-g", "5"],
     "-g 5: each process drives GPUs of one node"),
    (["memory", "--params", "7.5e9", "--dp", "64", "--pa"], "--pa shapes the residual states: give --hidden"),
    (["memory", "--params", "7.5e9", "--dp", "64", "--hidden", "4096", "--seq", "1024", "--batch", "4",
      "--no-checkpointing", "--ckpt-every", "2"], "they need checkpointing (drop --no-checkpointing)"),
    (["validate", "paper", "--suite-file", "x.yaml"], "--suite-file applies to the replay, scale and modern suites"),
    (["validate", "paper", "--png", "chart.txt"], "--png chart.txt: expected a .png file name"),
])
def test_options_that_contradict_each_other_are_refused(args, message):
    """An option the rest of the command line makes meaningless is exit 2, not silently dropped."""
    proc = zsim(*args)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr

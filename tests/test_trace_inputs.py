"""Damaged measurement inputs (runtime traces, Kineto traces, GEMM and nccl-tests tables, simulated
traces) are one message naming the file and the field, exit 2: never an internal error, a nan in a
report, a hang or a run out of memory (a bad-input audit found each of these)."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from zsim.cli import main
from zsim.errors import ConfigError
from zsim.trace.deepbench import is_gemm_table, read_gemm_table
from zsim.calibrate.inputs import kind_of, read_inputs
from zsim.trace.json_file import load_json
from zsim.trace.kineto import read_rank
from zsim.trace.nccl_tests import recording_of
from zsim.trace.run_reader import read_run
from zsim.trace.schema import SCHEMA, complete

# ---- runtime traces ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """A real 2-rank runtime trace (gloo, stage 1, 2 steps), recorded once for the module (~2 s)."""
    out = tmp_path_factory.mktemp("run") / "t"
    done = subprocess.run([sys.executable, "-m", "zsim.runtime", "--ranks", "2", "--stage", "1", "--steps", "2",
                           "--model", str(ROOT / "scenarios" / "calibrate" / "gpt-tiny-a.yaml"), "-o", str(out)],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    return out


def damaged(recorded: Path, tmp_path: Path, change, ranks: tuple[int, ...] = (0,)) -> Path:
    """A copy of the recorded run with the documents of `ranks` changed by `change(doc)`."""
    run = tmp_path / "run"
    shutil.copytree(recorded, run)
    for rank in ranks:
        path = run / f"rank{rank}.trace.json"
        doc = json.loads(path.read_text())
        change(doc)
        path.write_text(json.dumps(doc))
    return run


def _spans(doc):
    return [e for e in doc["traceEvents"] if e.get("ph") == "X"]


def _set_durations(value):
    def change(doc):
        for e in _spans(doc):
            e["dur"] = value
    return change


def _set_first(key, value, where=lambda e: True):
    """Set `key` (or `args.<key>`) of the first span that `where` accepts."""
    def change(doc):
        span = next(e for e in _spans(doc) if where(e))
        (span["args"] if key.startswith("args.") else span)[key.removeprefix("args.")] = value
    return change


def _is_collective(event):
    return "group" in event["args"]


def _counter(doc):
    return next(e for e in doc["traceEvents"] if e.get("ph") == "C")


@pytest.mark.parametrize("change, message", [
    (_set_durations("abc"), "(fwd/embed): dur 'abc' is not a finite number >= 0"),  # was an internal error
    (_set_durations(float("nan")), "dur nan is not a finite number >= 0"),  # replay printed nan rows, exit 0
    (_set_durations(-5.0), "dur -5.0 is not a finite number >= 0"),  # calibrate wrote a profile from it
    (_set_first("ts", -100.0), "ts -100.0 is not a finite number >= 0"),
    (_set_first("ts", None), "ts None is not a finite number >= 0"),
    (lambda doc: doc["traceEvents"].append({"ph": "X"}), "has no name"),  # was KeyError: 'ts'
    (lambda doc: doc["traceEvents"].append(1), "an event must be a mapping, got 1"),
    (_set_first("args", [1]), "args [1] is not a mapping"),
    (_set_first("args.step", "0"), "args.step '0' is not an integer 0 to 1,000,000"),
    (_set_first("args.last_arrival_ts", float("nan"), _is_collective), "args.last_arrival_ts nan is not a finite"),
    (_set_first("args.group", ["a"], _is_collective), "args.group ['a'] is not a list of ranks"),
    (_set_first("args.op", "foo", _is_collective), "args.op 'foo' is not a collective"),
    (lambda doc: _counter(doc)["args"].update(params=float("inf")), "(memory): args.params inf is not a finite"),
    (lambda doc: doc["metadata"].update(clock_offset_us="x"), "metadata.clock_offset_us 'x' is not a finite number"),
    (lambda doc: doc["metadata"].update(zero=[1]), "metadata.zero is [1], not a mapping"),
])
def test_a_damaged_runtime_trace_is_refused_where_it_is_read(recorded, tmp_path, change, message):
    run = damaged(recorded, tmp_path, change)
    with pytest.raises(ConfigError, match="rank0.trace.json") as info:
        read_run(run)
    assert message in str(info.value)


def test_a_world_size_no_machine_has_is_refused_before_anything_that_size_is_built(recorded, tmp_path):
    """Both ranks claim 10¹² ranks: refused at once (a set of every rank was built first, and the
    process was killed for memory)."""
    run = damaged(recorded, tmp_path, lambda doc: doc["metadata"].update(world_size=10**12), ranks=(0, 1))
    with pytest.raises(ConfigError, match="rank0.trace.json: metadata.world_size 1000000000000 is not a world size"):
        read_run(run)


@pytest.mark.parametrize("rank", [0, 1])
def test_a_damaged_metadata_value_is_blamed_on_its_own_file_by_its_key(recorded, tmp_path, rank):
    """layers 'abc' in one rank: that rank's file and metadata.model.layers are named (rank 0's was
    blamed on rank1.trace.json, with a cut-off dump of the whole model section)."""
    run = damaged(recorded, tmp_path, lambda doc: doc["metadata"]["model"].update(layers="abc"), ranks=(rank,))
    with pytest.raises(ConfigError, match=rf"rank{rank}.trace.json: metadata.model.layers is 'abc', which no run "
                                          rf"writes \(rank{1 - rank}.trace.json has 2\)"):
        read_run(run)


def test_ranks_of_different_runs_name_the_key_and_both_values(recorded, tmp_path):
    run = damaged(recorded, tmp_path, lambda doc: doc["metadata"]["model"].update(layers=3))
    with pytest.raises(ConfigError, match=r"rank1.trace.json: metadata.model.layers is 2 here but 3 in rank0"):
        read_run(run)


def test_replay_and_calibrate_say_it_in_one_line(recorded, tmp_path, capsys):
    run = damaged(recorded, tmp_path, _set_durations("abc"))
    assert main(["replay", str(run), "--profile", "dev-2core", "-o", str(tmp_path / "r")]) == 2
    assert main(["calibrate", str(run), "--profile", "dev-2core", "-o", str(tmp_path / "c.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.count("dur 'abc' is not a finite number") == 2 and "internal error" not in err
    assert not (tmp_path / "c.yaml").exists()


def _merge(run: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zsim.runtime.merge", str(run)], capture_output=True, text=True,
                          cwd=ROOT)


@pytest.mark.parametrize("change, message", [
    (lambda doc: doc["traceEvents"].append(1), "]: an event must be a mapping, got 1"),  # was a traceback
    (lambda doc: doc["traceEvents"].append({"ph": "X"}), "]: has no name"),  # was merged as it was
    (_set_first("args.group", "dp", _is_collective), "args.group 'dp' is not a list of ranks"),
    (lambda doc: doc["metadata"].update(rank=1), "metadata.rank is 1: the file of that rank is rank1.trace.json"),
])
def test_merge_refuses_a_damaged_trace_and_writes_nothing(recorded, tmp_path, change, message):
    run = damaged(recorded, tmp_path, change)
    before = (run / "rank1.trace.json").read_bytes()
    done = _merge(run)
    assert done.returncode == 2 and "rank0.trace.json: " in done.stderr and message in done.stderr
    assert "Traceback" not in done.stderr and (run / "rank1.trace.json").read_bytes() == before


def test_merge_refuses_a_damaged_rank_summary(recorded, tmp_path):
    run = damaged(recorded, tmp_path, lambda doc: None)
    summary = json.loads((run / "rank0.summary.json").read_text())
    (run / "rank0.summary.json").write_text(json.dumps(dict(summary, step_seconds=[1.0])))
    done = _merge(run)
    assert done.returncode == 2 and "rank0.summary.json: step_seconds [1.0] is not 2 finite numbers" in done.stderr


# ---- Kineto traces ----------------------------------------------------------------------------------

NCCL_KERNEL = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*)"


def kineto_file(tmp_path: Path, info=None, events=None, **doc) -> Path:
    """A minimal new-format Kineto file: one NCCL all-reduce kernel of 1024 floats on 2 ranks."""
    kernel = {"ph": "X", "name": NCCL_KERNEL, "cat": "kernel", "ts": 10.0, "dur": 5.0,
              "args": {"Collective name": "allreduce", "In msg nelems": 1024, "Out msg nelems": 1024,
                       "Group size": 2, "dtype": "Float"}}
    body = {"traceEvents": [kernel] if events is None else events,
            "distributedInfo": info or {"rank": 0, "world_size": 2}, **doc}
    path = tmp_path / "rank0.pt.trace.json"
    path.write_text(json.dumps(body))
    return path


def _kernel_args(**changes):
    return lambda doc: doc["traceEvents"][0]["args"].update(changes)


@pytest.mark.parametrize("change, message", [
    (lambda doc: doc["distributedInfo"].update(rank="a"), "distributedInfo.rank: 'a' is not a count"),
    (lambda doc: doc["distributedInfo"].update(world_size=10**12), "rank 0 of world_size 1000000000000"),
    (lambda doc: doc["traceEvents"][0].update(dur="x"), "ts '10.0' and dur 'x' must be finite numbers"),
    (lambda doc: doc["traceEvents"][0].update(args=[1]), "args is not a mapping"),
    (lambda doc: doc.update(traceEvents={}), "traceEvents is dict, not a list of events"),
    (_kernel_args(**{"In msg nelems": "x"}), "In msg nelems: 'x' is not a count"),
    (_kernel_args(**{"In msg nelems": 10**30}), "more than 17,592,186,044,416 bytes in one collective"),
    (_kernel_args(**{"Group size": 10**12}), "Group size 1000000000000 is not 1 to world_size 2"),  # was killed
    (_kernel_args(**{"Collective name": 5}), "unknown collective '5'"),
    (_kernel_args(dtype=[1]), "unknown element type '[1]'"),
])
def test_a_damaged_kineto_trace_names_the_field(tmp_path, change, message):
    path = kineto_file(tmp_path)
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match="rank0.pt.trace.json") as caught:
        read_rank(path)
    assert message in str(caught.value)
    read_rank(kineto_file(tmp_path))  # the undamaged file reads


def test_an_older_kineto_trace_with_damaged_input_dims_names_it(tmp_path):
    annotation = {"ph": "X", "name": "nccl:all_reduce", "cat": "user_annotation", "ts": 9.0, "dur": 1.0,
                  "args": {"Input Dims": {"a": 1}, "Input type": ["float"]}}
    kernel = {"ph": "X", "name": NCCL_KERNEL, "cat": "kernel", "ts": 10.0, "dur": 5.0, "args": {}}
    with pytest.raises(ConfigError, match="rank0.pt.trace.json: nccl:all_reduce at ts 9.0: no Input Dims"):
        read_rank(kineto_file(tmp_path, events=[annotation, kernel]))


@pytest.mark.parametrize("content, message", [
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b"[" + b"1" * 5000 + b"]", "value has 5000 digits"),  # int() refuses: was an internal error
    # mtime=0: the gzip header holds the time, and pytest-xdist's workers must collect the same ids
    (gzip.compress(b'{"traceEvents": []}', mtime=0)[:-12], "cannot read"),
], ids=["nested", "long-integer", "truncated-gzip"])
def test_an_unreadable_trace_file_is_named(tmp_path, content, message):
    path = tmp_path / ("x.json.gz" if content[:2] == b"\x1f\x8b" else "x.json")
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=rf"x.json(.gz)?: .*{message}"):
        load_json(path)


def test_calibrate_names_a_non_numeric_rank_in_a_real_kineto_trace(shared_data, tmp_path, capsys):
    doc = json.loads(gzip.decompress((shared_data / "kineto/a100-2rank-nccl-metadata/rank0.pt.trace.json.gz")
                                     .read_bytes()))
    doc["distributedInfo"]["rank"] = "a"
    path = tmp_path / "k.pt.trace.json"
    path.write_text(json.dumps(doc))
    assert main(["calibrate", str(path), "--profile", "dgx-a100", "-o", str(tmp_path / "c.yaml"),
                 "--allow-missing-ranks"]) == 2
    err = capsys.readouterr().err
    assert "k.pt.trace.json: distributedInfo.rank: 'a' is not a count" in err and "internal error" not in err


# ---- GEMM and nccl-tests tables ---------------------------------------------------------------------

HEADER = "source,M,N,K,transA,transB,time_ms,tflops\n"
SHAPES = "".join(f"x,{64 * i},{128 * i},{256 * i},N,N,{0.01 * i},1\n" for i in range(1, 13))


@pytest.mark.parametrize("tail, message", [
    (b"x,1,1,1,N,N,1,\xe9\n", "not UTF-8 text"),  # was an internal error (UnicodeDecodeError)
    (b"x,1760,16,1760,N,N,nan,1\n", "line 14: time_ms 'nan' is not a finite number > 0"),  # 'Residuals are not finite'
    (b"x,1760,16,1760,N,N,-1,1\n", "line 14: time_ms '-1' is not a finite number > 0"),
    (b"x,1760,16,99999999999,N,N,1,1\n", "line 14: K '99999999999' is not an integer 1 to 2,147,483,648"),
    (b"x,0,16,1760,N,N,1,1\n", "line 14: M '0' is not an integer 1 to"),
    (b"x,1760\n", "line 14: no value in column(s) N, K, time_ms (a short row?)"),
    (b"\n\nx,1760,16,1760,N,N,x,1\n", "line 16: time_ms 'x'"),  # the file's line, blank lines counted
])
def test_calibrate_reads_a_gemm_table_as_strictly_as_gemm_fit(tmp_path, capsys, tail, message):
    table = tmp_path / "gemm_fp32.csv"
    table.write_bytes((HEADER + SHAPES).encode() + tail)
    assert main(["calibrate", str(table), "--profile", "dgx2", "-o", str(tmp_path / "c.yaml")]) == 2
    err = capsys.readouterr().err
    assert "gemm_fp32.csv: " in err and message in err and "internal error" not in err


def test_a_gemm_table_whose_header_is_not_utf8_is_still_a_gemm_table_and_refused(tmp_path):
    table = tmp_path / "g.csv"
    table.write_bytes(b"M,N,K,time_ms,\xe9\n1,1,1,1,x\n")
    assert is_gemm_table(table)
    with pytest.raises(ConfigError, match=r"g.csv: not UTF-8 text"):
        read_gemm_table(table)


NCCL_HEADER = b"# nThread 1 nGpus %s minBytes 8\n" + b"".join(b"#  Rank %2d Pid 1 on host device %d\n" % (r, r)
                                                               for r in range(4))


@pytest.mark.parametrize("body, message", [
    (NCCL_HEADER % b"1" + b"#\xe9\n", "not UTF-8 text"),  # was an internal error (UnicodeDecodeError)
    (NCCL_HEADER % "²".encode(), "header: nGpus '²' is not a count of GPUs"),  # was ValueError
    (NCCL_HEADER % b"3", "header: nGpus 3 (GPUs per process) does not divide the 4 ranks"),
    (NCCL_HEADER % b"0", "header: nGpus 0 (GPUs per process) does not divide the 4 ranks"),
])
def test_a_damaged_nccl_tests_header_is_refused(tmp_path, body, message):
    table = tmp_path / "all_reduce.txt"
    table.write_bytes(body)
    with pytest.raises(ConfigError, match=r"all_reduce.txt: ") as caught:
        recording_of(table)
    assert message in str(caught.value)
    table.write_bytes(NCCL_HEADER % b"2")
    assert recording_of(table) == (4, 2)


def test_calibrate_refuses_a_real_nccl_tests_table_that_is_not_utf8(shared_data, tmp_path, capsys):
    folder = tmp_path / "n"
    folder.mkdir()
    table = folder / "all_reduce.txt"
    table.write_bytes((shared_data / "nccl-tests/dgx2-v100-12gpu/all_reduce.txt").read_bytes() + b"#\xe9\n")
    assert main(["calibrate", str(folder), "--profile", "dgx2", "-o", str(tmp_path / "c.yaml")]) == 2
    err = capsys.readouterr().err
    assert "all_reduce.txt: not UTF-8 text" in err and "internal error" not in err


# ---- FIFOs and simulated traces ---------------------------------------------------------------------

@pytest.mark.parametrize("name", ["rank0.pt.trace.json", "gemm.csv", "all_reduce.txt"])
def test_a_fifo_given_to_calibrate_is_refused_not_waited_on(tmp_path, capsys, name):
    fifo = tmp_path / name
    os.mkfifo(fifo)
    assert main(["calibrate", str(fifo), "--profile", "dgx-a100", "-o", str(tmp_path / "c.yaml")]) == 2
    assert f"{name}: not a regular file" in capsys.readouterr().err


def test_a_fifo_inside_a_run_folder_is_refused_not_waited_on(recorded, tmp_path):
    run = damaged(recorded, tmp_path, lambda doc: None)
    (run / "rank1.trace.json").unlink()
    os.mkfifo(run / "rank1.trace.json")
    with pytest.raises(ConfigError, match="rank1.trace.json: not a regular file"):
        read_run(run)


def test_a_simulated_trace_is_checked_like_a_runtime_trace(tmp_path):
    event = complete("fwd/layer.0", 0, "compute", 0.0, 1.0, step=0, micro_batch=0, flops=1e9)
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"schema": SCHEMA, "metadata": {"source": "simulated"},
                                "traceEvents": [event, dict(event, dur="x")]}))
    assert kind_of(path) == "simulated"
    with pytest.raises(ConfigError, match=r"trace.json: traceEvents\[1\] \(fwd/layer.0\): dur 'x' is not a finite"):
        read_inputs([path])

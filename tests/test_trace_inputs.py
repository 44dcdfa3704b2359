"""Damaged measurement inputs (runtime traces, Kineto traces, GEMM and nccl-tests tables) are one
message naming the file and the field, exit 2: never an internal error, a nan in a report, a hang or a
run out of memory (a bad-input audit found each of these)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from zsim.cli import main
from zsim.errors import ConfigError
from zsim.trace.kineto import read_rank
from zsim.trace.nccl_tests import recording_of
from zsim.trace.run_reader import read_run


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """A real 2-rank runtime trace (gloo, stage 1, 2 steps), recorded once for the module."""
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


def _set_durations(value):
    def change(doc):
        for e in doc["traceEvents"]:
            if "dur" in e:
                e["dur"] = value
    return change


@pytest.mark.parametrize("change, message", [
    (_set_durations("abc"), "span 0 (fwd/embed): dur 'abc' is not a finite number >= 0"),
    (_set_durations(float("nan")), "dur nan is not a finite number >= 0"),  # replay printed nan rows, exit 0
    (_set_durations(-5.0), "dur -5.0 is not a finite number >= 0"),  # calibrate wrote a profile from it
    (lambda doc: doc["traceEvents"].append({"ph": "X"}), "has no name"),
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
    with pytest.raises(ConfigError, match="metadata.world_size 1000000000000 is not a world size"):
        read_run(run)


def test_replay_and_calibrate_say_it_in_one_line(recorded, tmp_path, capsys):
    run = damaged(recorded, tmp_path, _set_durations("abc"))
    assert main(["replay", str(run), "--profile", "dev-2core", "-o", str(tmp_path / "r")]) == 2
    assert main(["calibrate", str(run), "--profile", "dev-2core", "-o", str(tmp_path / "c.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.count("dur 'abc' is not a finite number") == 2 and "internal error" not in err


def test_merge_refuses_an_event_that_is_not_a_mapping(recorded, tmp_path):
    run = damaged(recorded, tmp_path, lambda doc: doc["traceEvents"].append(1))
    done = subprocess.run([sys.executable, "-m", "zsim.runtime.merge", str(run)], capture_output=True, text=True,
                          cwd=ROOT)
    assert done.returncode == 2 and "rank0.trace.json: traceEvents: event" in done.stderr
    assert "is not a mapping" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("info, events, message", [
    ({"rank": "a", "world_size": 2}, [], "distributedInfo.rank: 'a' is not a count"),
    ({"rank": 0, "world_size": 10**12}, [], "rank 0 of world_size 1000000000000"),
    ({"rank": 0, "world_size": 2}, [{"ph": "X", "name": "k", "cat": "kernel", "ts": 1.0, "dur": "x"}],
     "'k': ts '1.0' and dur 'x' must be finite numbers"),
])
def test_a_damaged_kineto_trace_names_the_field(tmp_path, info, events, message):
    path = tmp_path / "rank0.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": events, "distributedInfo": info}))
    with pytest.raises(ConfigError, match="rank0.pt.trace.json") as caught:
        read_rank(path)
    assert message in str(caught.value)


HEADER = "source,M,N,K,transA,transB,time_ms,tflops\n"
SHAPES = "".join(f"x,{64 * i},{128 * i},{256 * i},N,N,{0.01 * i},1\n" for i in range(1, 13))


@pytest.mark.parametrize("tail, message", [
    (b"x,1,1,1,N,N,1,\xe9\n", "not UTF-8 text"),
    (b"x,1760,16,1760,N,N,nan,1\n", "line 14: sizes and time must be finite and positive"),
    (b"x,1760,16,99999999999,N,N,1,1\n", "line 14: M, N, K must be at most"),
])
def test_calibrate_reads_a_gemm_table_as_strictly_as_gemm_fit(tmp_path, capsys, tail, message):
    table = tmp_path / "gemm_fp32.csv"
    table.write_bytes((HEADER + SHAPES).encode() + tail)
    assert main(["calibrate", str(table), "--profile", "dgx2", "-o", str(tmp_path / "c.yaml")]) == 2
    err = capsys.readouterr().err
    assert "gemm_fp32.csv: " in err and message in err and "internal error" not in err


def test_an_nccl_tests_header_that_is_not_text_is_refused(tmp_path):
    table = tmp_path / "all_reduce.txt"
    table.write_bytes(b"# nThread 1 nGpus 12\n#  Rank  0 Pid 1 on host device 0\n#\xe9\n")
    with pytest.raises(ConfigError, match=r"all_reduce.txt: not UTF-8 text"):
        recording_of(table)


def test_ranks_that_disagree_name_the_key_inside_the_metadata(recorded, tmp_path):
    """One rank's model says layers 'abc': the message names metadata.model.layers and both values, not
    a cut-off dump of the whole model section."""
    run = damaged(recorded, tmp_path, lambda doc: doc["metadata"]["model"].update(layers="abc"))
    with pytest.raises(ConfigError, match=r"metadata.model.layers is 2 here but 'abc' in rank0.trace.json"):
        read_run(run)


def test_a_fifo_named_like_a_trace_is_refused_not_waited_on(tmp_path, capsys):
    import os

    fifo = tmp_path / "rank0.pt.trace.json"
    os.mkfifo(fifo)
    assert main(["calibrate", str(fifo), "--profile", "dgx-a100", "-o", str(tmp_path / "c.yaml")]) == 2
    assert "rank0.pt.trace.json: not a regular file" in capsys.readouterr().err

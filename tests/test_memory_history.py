"""The allocator's own history of a CUDA run (`--cuda-memory-history`, runtime/memory_history.py) and its
replay through zsim's allocator model (zsim.calibrate.memory_history): compacting a snapshot, reading it
back, and on the H200 histories (data/device/20261127-h200-memhist and -holdout; skipped without them) the replay of
the runtime's own requests reserving what PyTorch reserved, to the byte."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from zsim.calibrate.memory_history import FORMAT, live_at_peak, read, replay
from zsim.runtime import memory_history as mh

DEVICE = Path(__file__).resolve().parents[1] / "data" / "device"
HISTORY_FILES = sorted(DEVICE.glob("20261127-h200-*/runs/*-memhist/rank0.memory_history.json.gz"))


def _frame(path: str, line: int, name: str) -> dict:
    return {"filename": path, "line": line, "name": name}


def _snapshot() -> dict:
    mark = [_frame("/x/zsim/runtime/memory_history.py", 60, "mark"), _frame("/x/zsim/runtime/worker.py", 200, "_train")]
    linear = [_frame("/usr/lib/torch/nn/modules/linear.py", 134, "forward"),
              _frame("/x/zsim/runtime/model.py", 129, "forward"), _frame("/x/zsim/runtime/zero/engine.py", 216, "_run")]
    trace = [
        {"action": "segment_alloc", "addr": 0, "size": 2 << 20, "stream": 0, "time_us": 1, "frames": mark},
        {"action": "alloc", "addr": 0, "size": 512, "stream": 0, "time_us": 1, "frames": mark},
        {"action": "free_completed", "addr": 0, "size": 512, "stream": 0, "time_us": 2, "frames": []},
        {"action": "segment_alloc", "addr": 1 << 30, "size": 20 << 20, "stream": 0, "time_us": 3, "frames": linear},
        {"action": "alloc", "addr": 1 << 30, "size": 3 << 20, "stream": 0, "time_us": 3, "frames": linear},
        {"action": "alloc", "addr": (1 << 30) + (3 << 20), "size": 3 << 20, "stream": 0, "time_us": 4, "frames": linear},
        {"action": "free_completed", "addr": 1 << 30, "size": 3 << 20, "stream": 0, "time_us": 5, "frames": []},
        {"action": "alloc", "addr": 4096, "size": 512, "stream": 0, "time_us": 6, "frames": mark},
    ]
    return {"device_traces": [trace], "segments": [
        {"device": 0, "address": 0, "total_size": 2 << 20, "stream": 0, "allocated_size": 0, "segment_type": "small"},
        {"device": 1, "address": 9, "total_size": 2 << 20, "stream": 0, "allocated_size": 0, "segment_type": "small"}]}


def test_compact_keeps_one_row_per_entry_and_each_site_once():
    marks = [{"step": 0, "time_us": 1}, {"step": "end", "time_us": 6}, {"step": "never", "time_us": 7}]
    data = mh.compact(_snapshot(), 0, marks)
    assert data["format"] == FORMAT and not data["truncated"]
    assert len(data["events"]) == 8 and data["events"][4] == [3, "alloc", 1 << 30, 3 << 20, 0, 1]
    assert data["sites"] == ["memory_history.py:60:mark < worker.py:200:_train",
                             "linear.py:134:forward < model.py:129:forward < zero/engine.py:216:_run"]
    assert data["events"][2][5] == -1  # a free without frames
    assert [m["event"] for m in data["marks"]] == [1, 7, None]  # the marker allocations, in order
    assert [s["address"] for s in data["segments"]] == [0]  # this device's only


def test_read_refuses_what_is_not_a_history(tmp_path):
    wrong = tmp_path / "x.json.gz"
    with gzip.open(wrong, "wt") as f:
        json.dump({"format": "other"}, f)
    with pytest.raises(ValueError, match="not a zsim memory history"):
        read(wrong)
    (tmp_path / "y.json.gz").write_text("plain")
    with pytest.raises(ValueError, match="not a readable memory history"):
        read(tmp_path / "y.json.gz")


def test_replay_of_a_small_history(tmp_path):
    data = mh.compact(_snapshot(), 0, [{"step": 0, "time_us": 1}, {"step": 1, "time_us": 6}])
    path = tmp_path / "h.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(data, f)
    r = replay(read(path))
    assert r.requests == 4 and r.unknown_frees == 0
    assert r.reserved_peak == (2 << 20) + (20 << 20) == r.replayed_peak  # a 2 MiB small and a 20 MiB large segment
    allocated, sites = live_at_peak(read(path), step=0)
    assert allocated == 2 * (3 << 20)  # the marker freed before them
    assert sites["linear.py:134:forward < model.py:129:forward < zero/engine.py:216:_run"] == (2 * (3 << 20), 2)
    with pytest.raises(ValueError, match="step 5"):
        live_at_peak(read(path), step=5)


@pytest.mark.skipif(not HISTORY_FILES, reason="no H200 allocator histories in data/device/")
@pytest.mark.parametrize("path", HISTORY_FILES, ids=lambda p: p.parts[-3])
def test_zsims_allocator_reserves_what_pytorch_reserved_for_the_same_requests(path):
    """Every request of three steps (over a thousand blocks a run, six runs), replayed in the runtime's order
    through zsim.memory.allocator: the same reserved bytes after setup and the same reserved peak, to the
    byte. What the simulated peaks still miss (docs/device-check.md) is in the plan's requests."""
    r = replay(read(path))
    assert r.unknown_frees == 0 and r.requests > 1000
    assert r.replayed_at_start == r.reserved_at_start
    assert r.replayed_peak == r.reserved_peak

"""The caching allocator's own history of a CUDA run, block by block (`--cuda-memory-history`): what
each request asked for, when, on which stream and from which line of the runtime, so that zsim's
allocator model can be checked on the very sequence the runtime issued (issue 26: the reserved peak).

PyTorch records it (`torch.cuda.memory._record_memory_history`, documented in "Understanding CUDA
Memory Usage", pytorch.org/docs/stable/torch_cuda_memory.html) and returns it with
`torch.cuda.memory._snapshot()`: `device_traces[d]` holds one entry per allocator action (`alloc`,
`free_requested`, `free_completed`, `segment_alloc`, `segment_free`, `oom`, ...) with `addr`, `size`
(bytes, rounded as the allocator rounds), `stream`, `time_us` and the Python `frames` of the request.
A raw snapshot with its stacks runs to tens of megabytes; `compact` keeps each entry as one row and
each distinct call site once.

The file written, `rank<R>.memory_history.json.gz`:
  format: "zsim-memory-history/1"
  events: [time_us, action, addr, size, stream, site] per entry, in the allocator's order
          (site: an index into `sites`, -1 without frames)
  sites: "file.py:line:function < file.py:line:function ..." -- up to three innermost frames in
         zsim's runtime, and the innermost frame when it is not one of them (torch's, say)
  marks: [{"step": i | "end", "time_us": t, "event": n}]: the host's clock at each step start, and
         the number of events recorded by then (the step's marker allocation, see `mark`)
  segments: the segments held when the snapshot was taken (address, total_size, stream, allocated_size)
  truncated: true when the history filled `max_entries` (the oldest entries were dropped)
"""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path
from typing import Any

from zsim.trace.memory_history import FORMAT
MAX_ENTRIES = 2_000_000  # a ring buffer in the allocator; a 3-step run of the device check's shapes is far below
MARK_BYTES = 1  # the step marker: one byte, a 512 B block of the small pool (kMinBlockSize)
SITE_FRAMES = 3


def path(out_dir: Path, rank: int) -> Path:
    """Where rank `rank`'s history is written in a run's folder."""
    return out_dir / f"rank{rank}.memory_history.json.gz"


def start(torch: Any, device: Any) -> None:
    """Begin recording `device`'s allocator history with Python stacks of each allocation."""
    torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python",
                                             max_entries=MAX_ENTRIES, device=device)


def mark(torch: Any, device: Any, marks: list[dict[str, Any]], step: int | str) -> None:
    """Note a step boundary: the host clock, and a one-byte allocation freed at once, whose site
    (this function) finds the boundary in the allocator's own order of events."""
    marks.append({"step": step, "time_us": time.time_ns() // 1000})
    marker = torch.empty(MARK_BYTES, dtype=torch.uint8, device=device)
    del marker


def stop_and_write(torch: Any, device: Any, marks: list[dict[str, Any]], path: Path) -> None:
    """Take the snapshot, stop recording, and write `compact`'s result to `path` (gzip'd JSON)."""
    snapshot = torch.cuda.memory._snapshot(device)
    torch.cuda.memory._record_memory_history(enabled=None, device=device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    data = compact(snapshot, index, marks)
    data["torch"] = torch.__version__
    with gzip.open(path, "wt") as f:
        json.dump(data, f, separators=(",", ":"))


def site(frames: list[dict[str, Any]]) -> str:
    """A call site from a stack (innermost frame first): the innermost frames in zsim's runtime, and
    the innermost frame of all when it is outside the runtime."""
    def name(frame: dict[str, Any]) -> str:
        path = str(frame.get("filename", "?"))
        short = path.rsplit("/runtime/", 1)[-1] if "/runtime/" in path else path.rsplit("/", 1)[-1]
        return f"{short}:{frame.get('line', '?')}:{frame.get('name', '?')}"

    ours = [f for f in frames if "/runtime/" in str(f.get("filename", "")) and "/torch/" not in str(f.get("filename", ""))]
    parts = [name(f) for f in ours[:SITE_FRAMES]]
    if frames and (not ours or frames[0] is not ours[0]):
        parts.insert(0, name(frames[0]))
    return " < ".join(parts)


def compact(snapshot: dict[str, Any], device_index: int, marks: list[dict[str, Any]]) -> dict[str, Any]:
    """One device's history from a `torch.cuda.memory._snapshot()` dict, one row per entry (see the
    module's docstring). Each mark gets `event`: the index of its marker allocation (the first
    one-block allocation from `mark` after the previous mark), or None when it was not recorded."""
    traces = snapshot.get("device_traces") or []
    entries = traces[device_index] if device_index < len(traces) else []
    sites: dict[str, int] = {}
    events = []
    marker_rows = []
    for entry in entries:
        frames = entry.get("frames") or []
        where = site(frames) if frames else ""
        idx = sites.setdefault(where, len(sites)) if where else -1
        events.append([entry.get("time_us"), entry.get("action"), entry.get("addr"), entry.get("size"),
                       entry.get("stream"), idx])
        if entry.get("action") == "alloc" and any(f.get("name") == "mark" and "memory_history" in
                                                  str(f.get("filename", "")) for f in frames):
            marker_rows.append(len(events) - 1)
    marks = [dict(m) for m in marks]
    for m, row in zip(marks, marker_rows):
        m["event"] = row
    for m in marks[len(marker_rows):]:
        m["event"] = None
    segments = [{"address": s.get("address"), "total_size": s.get("total_size"), "stream": s.get("stream"),
                 "allocated_size": s.get("allocated_size"), "segment_type": s.get("segment_type")}
                for s in snapshot.get("segments") or [] if s.get("device", device_index) == device_index]
    return {"format": FORMAT, "device": device_index, "events": events, "sites": list(sites), "marks": marks,
            "segments": segments, "allocator_settings": snapshot.get("allocator_settings"),
            "max_entries": MAX_ENTRIES, "truncated": len(entries) >= MAX_ENTRIES}

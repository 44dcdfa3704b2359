"""A ledger's memory timeline as data: bytes by category, fragmentation and reserved over simulated
time, downsampled for the result JSON (the exact peaks kept) and written whole as CSV.

Plain Python lists, no numpy: `zsim run` writes its outputs without importing numpy (~10% of the
flagship's start-up); a few thousand samples take well under a millisecond either way.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zsim.memory.ledger import CATEGORIES, MemoryLedger

if TYPE_CHECKING:
    import numpy as np

MAX_POINTS = 400  # result JSON: at most this many samples per timeline (plus the peaks)
CSV_COLUMNS = ("time_s", *CATEGORIES, "fragmentation", "allocated", "reserved")


def _table(ledger: MemoryLedger) -> tuple[list[float], list[tuple[int, ...]], list[int], list[int]]:
    """(times, category rows (T × C), allocated (T), reserved (T))."""
    return ledger.times, ledger.rows, [sum(row) for row in ledger.rows], ledger.reserved_rows


def _keep(allocated: Sequence[int], reserved: Sequence[int], max_points: int) -> list[int]:
    n = len(allocated)
    if n <= max_points:
        return list(range(n))
    keep = {0, n - 1, max(range(n), key=allocated.__getitem__), max(range(n), key=reserved.__getitem__)}
    size, extra = divmod(n, max_points)  # the runs of numpy.array_split: the first `extra` one longer
    start = 0
    for j in range(max_points):
        stop = start + size + (j < extra)
        keep.add(max(range(start, stop), key=reserved.__getitem__))  # the first maximum, as argmax
        start = stop
    return sorted(keep)


def keep_indices(allocated: Sequence[int], reserved: Sequence[int], max_points: int = MAX_POINTS) -> np.ndarray:
    """Indices of a downsampled timeline: the first and last sample, the exact peaks of allocated and
    reserved memory, and in each of `max_points` equal runs of samples the one with the most
    reserved memory (a max-preserving decimation: no spike is lost, only the dips between)."""
    import numpy as np

    return np.asarray(_keep(list(allocated), list(reserved), max_points), dtype=np.int64)


def timeline_facts(ledger: MemoryLedger, max_points: int = MAX_POINTS) -> dict[str, Any]:
    """The timeline for the result JSON (docs/result-json.md, `memory.timeline`): times in s, bytes."""
    times, rows, allocated, reserved = _table(ledger)
    idx = _keep(allocated, reserved, max_points)
    return {
        "samples": len(times),
        "points": len(idx),
        "time_s": [float(times[i]) for i in idx],
        "bytes": {c: [rows[i][j] for i in idx] for j, c in enumerate(CATEGORIES)},
        "fragmentation": [reserved[i] - allocated[i] for i in idx],
        "allocated": [allocated[i] for i in idx],
        "reserved": [reserved[i] for i in idx],
    }


def write_csv(ledger: MemoryLedger, path: Path) -> Path:
    """Every sample of the timeline as CSV (columns CSV_COLUMNS; bytes, seconds)."""
    times, rows, allocated, reserved = _table(ledger)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(CSV_COLUMNS)
        writer.writerows((repr(float(t)), *row, res - alloc, alloc, res)
                         for t, row, alloc, res in zip(times, rows, allocated, reserved))
    return path

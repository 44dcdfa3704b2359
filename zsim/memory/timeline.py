"""A ledger's memory timeline as data: bytes by category, fragmentation and reserved over simulated
time, downsampled for the result JSON (the exact peaks kept) and written whole as CSV."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np

from zsim.memory.ledger import CATEGORIES, MemoryLedger

MAX_POINTS = 400  # result JSON: at most this many samples per timeline (plus the peaks)
CSV_COLUMNS = ("time_s", *CATEGORIES, "fragmentation", "allocated", "reserved")


def _table(ledger: MemoryLedger) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(times, category rows (T, C), allocated (T,), reserved (T,))."""
    times, rows = ledger.timeline()
    return times, rows, rows.sum(axis=1), ledger.reserved_timeline()


def keep_indices(allocated: np.ndarray, reserved: np.ndarray, max_points: int = MAX_POINTS) -> np.ndarray:
    """Indices of a downsampled timeline: the first and last sample, the exact peaks of allocated and
    reserved memory, and in each of `max_points` equal runs of samples the one with the most
    reserved memory (a max-preserving decimation: no spike is lost, only the dips between)."""
    n = len(allocated)
    if n <= max_points:
        return np.arange(n)
    keep = {0, n - 1, int(np.argmax(allocated)), int(np.argmax(reserved))}
    for chunk in np.array_split(np.arange(n), max_points):
        keep.add(int(chunk[np.argmax(reserved[chunk])]))
    return np.asarray(sorted(keep))


def timeline_facts(ledger: MemoryLedger, max_points: int = MAX_POINTS) -> dict[str, Any]:
    """The timeline for the result JSON (docs/result-json.md, `memory.timeline`): times in s, bytes."""
    times, rows, allocated, reserved = _table(ledger)
    idx = keep_indices(allocated, reserved, max_points)
    return {
        "samples": int(len(times)),
        "points": int(len(idx)),
        "time_s": times[idx].tolist(),
        "bytes": {c: rows[idx, j].tolist() for j, c in enumerate(CATEGORIES)},
        "fragmentation": (reserved - allocated)[idx].tolist(),
        "allocated": allocated[idx].tolist(),
        "reserved": reserved[idx].tolist(),
    }


def write_csv(ledger: MemoryLedger, path: Path) -> Path:
    """Every sample of the timeline as CSV (columns CSV_COLUMNS; bytes, seconds)."""
    times, rows, allocated, reserved = _table(ledger)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(CSV_COLUMNS)
        for i, t in enumerate(times):
            writer.writerow((repr(float(t)), *rows[i].tolist(), int(reserved[i] - allocated[i]), int(allocated[i]),
                             int(reserved[i])))
    return path

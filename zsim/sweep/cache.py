"""A sweep's cache: one file per finished point, `cache/<key>.json`, checked whole before it is reused.

An entry is `{"schema": ENTRY_SCHEMA, "key": <point key>, "sha256": <hash of the row>, "row": {...}}`.
It is reused only when every check holds; otherwise the point is run again and counted as `rerun`
(a damaged entry is never a result: issue 28):
- a regular file (not a FIFO, a device or a symlink: opened with O_NONBLOCK | O_NOFOLLOW, so a FIFO
  never blocks), at most MAX_ENTRY_BYTES, UTF-8 JSON;
- its schema, its own key equal to the point's key and to the row's `key` (another point's row is
  refused), the sha256 of the row's canonical JSON equal to the one stored;
- the row's columns exactly zsim.sweep.row.COLUMNS, each of its type, numbers finite and in range
  (`check_row`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import stat
from pathlib import Path
from typing import Any

from zsim.sweep.row import COLUMNS

ENTRY_SCHEMA = "zsim-sweep-point/1"
MAX_ENTRY_BYTES = 1 << 20  # a row is ~1 kB; anything near a MiB is not one of ours

# Column kinds (zsim.sweep.row.result_row): what each value may be.
POSITIVE = ("step_s", "capacity_bytes", "gpus")
NON_NEGATIVE = ("compute_s", "mp_comm_s", "dp_comm_s", "offload_s", "comm_share", "tflops_per_gpu",
                "percent_of_peak", "tokens_per_s", "peak_bytes", "reserved_peak_bytes", "model_states_bytes",
                "allocator_flushes")
SIGNED = ("exposed_comm_s", "exposed_share", "reserved_margin_share")  # differences: may dip below 0
INTEGERS = ("peak_bytes", "reserved_peak_bytes", "capacity_bytes", "model_states_bytes", "allocator_flushes", "gpus")
TEXT = ("bottleneck_kind", "bottleneck", "mode", "key", "band_match")
OPTIONAL_TEXT = ("oom", "dp_algorithm", "band_regime")
OPTIONAL_POSITIVE = ("band_low_s", "band_high_s")  # the error band's step range; None outside every regime
STATUSES = ("fits", "oom")


def row_hash(row: dict[str, Any]) -> str:
    """sha256 of the row's canonical JSON (sorted keys, no spaces)."""
    return hashlib.sha256(json.dumps(row, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def entry_text(row: dict[str, Any]) -> str:
    """The cache file's text for a finished point's row."""
    return json.dumps({"schema": ENTRY_SCHEMA, "key": row["key"], "sha256": row_hash(row), "row": row},
                      allow_nan=False) + "\n"


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_row(row: Any, key: str) -> str | None:
    """What is wrong with `row` as the row of the point `key`, or None when nothing is."""
    if not isinstance(row, dict):
        return "the row is not a mapping"
    if set(row) != set(COLUMNS):
        odd = sorted(set(row) ^ set(COLUMNS))
        return f"the row's columns differ ({', '.join(map(str, odd[:3]))})"
    if row["key"] != key:
        return "the row is another point's"
    if row["status"] not in STATUSES:
        return "status is not fits or oom"
    for column in POSITIVE + NON_NEGATIVE + SIGNED:
        value = row[column]
        if not _number(value):
            return f"{column} is not a finite number"
        if column in INTEGERS and not isinstance(value, int):
            return f"{column} is not a whole number"
        if (column in POSITIVE and value <= 0) or (column in NON_NEGATIVE and value < 0):
            return f"{column} is out of range"
    for column in TEXT:
        if not isinstance(row[column], str):
            return f"{column} is not text"
    for column in OPTIONAL_TEXT:
        if row[column] is not None and not isinstance(row[column], str):
            return f"{column} is not text"
    if (row["status"] == "oom") != (row["oom"] is not None):
        return "status and oom disagree"
    for column in OPTIONAL_POSITIVE:
        value = row[column]
        if value is not None and not (_number(value) and value > 0):
            return f"{column} is not a positive number"
    return None


def read_entry(path: Path, key: str) -> tuple[dict[str, Any] | None, str | None]:
    """(row, None) for a sound entry of point `key`; (None, None) when there is none; (None, why)
    when there is one that cannot be reused. Never blocks (a FIFO is opened non-blocking and refused)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None, None
    except OSError as exc:  # a symlink (ELOOP), no permission...
        return None, f"cannot be opened ({exc.strerror})"
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None, "not a regular file"
        if info.st_size > MAX_ENTRY_BYTES:
            return None, f"larger than {MAX_ENTRY_BYTES:,} bytes"
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(MAX_ENTRY_BYTES + 1)
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror})"
    finally:
        os.close(fd)
    try:
        entry = json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None, "not JSON"
    if not isinstance(entry, dict) or set(entry) != {"schema", "key", "sha256", "row"}:
        return None, "not a cache entry"
    if entry["schema"] != ENTRY_SCHEMA:
        return None, f"schema is not {ENTRY_SCHEMA}"
    if entry["key"] != key:
        return None, "another point's entry"
    why = check_row(entry["row"], key)
    if why is None and entry["sha256"] != row_hash(entry["row"]):
        why = "its hash does not match its row"
    return (entry["row"], None) if why is None else (None, why)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def facts_ok(path: Path, max_bytes: int = 64 << 20) -> bool:
    """Whether `path` (a point's points/<key>/result.json) is a regular file holding a result's facts."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > max_bytes:
            return False
        with os.fdopen(fd, "rb", closefd=False) as fh:
            doc = json.loads(fh.read(max_bytes + 1).decode("utf-8"), parse_constant=_no_constant)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return False
    finally:
        os.close(fd)
    return isinstance(doc, dict) and doc.get("schema") == "zsim-result/1"

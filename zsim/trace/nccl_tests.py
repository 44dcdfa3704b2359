"""Reading nccl-tests output tables (NVIDIA/nccl-tests, `*_perf -b ... -e ... -f 2`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from zsim.config.yamlfile import read_text
from zsim.errors import ZsimError

MAX_TABLE_BYTES = 16 << 20  # an nccl-tests log is tens of KB
MAX_SIZE = 1 << 44  # 16 TiB: beyond any buffer nccl-tests can allocate


@dataclass(frozen=True, slots=True)
class NcclRow:
    """One out-of-place row: payload S in bytes, time in µs, algbw and busbw in GB/s (10^9 B/s)."""

    size: int
    count: int
    dtype: str
    time_us: float
    algbw: float
    busbw: float


def read_nccl_tests(path: Path) -> list[NcclRow]:
    """Parse the out-of-place columns of an nccl-tests table. Column positions come from the header
    line (`size count type [redop] [root] time algbw busbw ...`), which differs between collectives.

    Rows whose numbers are not finite, or whose size or time is not positive, are skipped (a
    truncated or edited line).

    Raises:
        ZsimError: unreadable, not UTF-8, too large, no header or no rows.
    """
    columns: list[str] | None = None
    rows: list[NcclRow] = []
    for line in read_text(Path(path), what="nccl-tests table", max_bytes=MAX_TABLE_BYTES).splitlines():
        words = line.lstrip("#").split()
        if words[:3] == ["size", "count", "type"]:
            columns = words
            continue
        if columns is None or line.startswith("#") or not words or not words[0].isdigit():
            continue
        try:
            at = {name: columns.index(name) for name in ("size", "count", "type", "time", "algbw", "busbw")}
            row = NcclRow(int(words[at["size"]]), int(words[at["count"]]), words[at["type"]][:16],
                          float(words[at["time"]]), float(words[at["algbw"]]), float(words[at["busbw"]]))
        except (ValueError, IndexError):
            continue  # a warning or a truncated line inside the table, or a header without those columns
        if 0 < row.size <= MAX_SIZE and 0 <= row.count <= MAX_SIZE and 0 < row.time_us < math.inf and all(
                0 <= x < math.inf for x in (row.algbw, row.busbw)):  # tiny sizes print 0.00 GB/s
            rows.append(row)
    if not rows:
        raise ZsimError(f"{path}: no nccl-tests table found (expected a '# size count type ...' header)")
    return rows


def recording_of(path: Path) -> tuple[int, int] | None:
    """(GPUs, GPUs per process) from a table's header: one `#  Rank  N ... device` line per GPU, and
    `nGpus G` (nccl-tests -g); None when the header does not list them."""
    ranks, per_process = 0, 1
    # the checked reader (regular file, bounded, UTF-8: ConfigError naming the file), as read_nccl_tests
    for line in read_text(Path(path), what="nccl-tests table", max_bytes=MAX_TABLE_BYTES).splitlines():
        words = line.lstrip("#").split()
        if words[:1] == ["Rank"] and len(words) > 1 and words[1].isdigit():
            ranks += 1
        if "nGpus" in words and words.index("nGpus") + 1 < len(words) and words[words.index("nGpus") + 1].isdigit():
            per_process = int(words[words.index("nGpus") + 1])
    return (ranks, per_process) if ranks else None


def is_table(path: Path) -> bool:
    """Whether `path` is a text file holding an nccl-tests header line."""
    if not path.is_file() or path.suffix not in (".txt", ".log", ".out"):
        return False
    return any(line.lstrip("#").split()[:3] == ["size", "count", "type"] for line in path.read_text(errors="replace").splitlines())

"""Reading nccl-tests output tables (NVIDIA/nccl-tests, `*_perf -b ... -e ... -f 2`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from zsim.config.limits import limit, too_many
from zsim.config.yamlfile import read_text
from zsim.errors import ConfigError, ZsimError, short

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
            if len(rows) > limit("TABLE_ROWS"):
                raise ConfigError(too_many("TABLE_ROWS", len(rows), "table rows"), source=str(path))
    if not rows:
        raise ZsimError(f"{path}: no nccl-tests table found (expected a '# size count type ...' header)")
    return rows


def recording_of(path: Path) -> tuple[int, int] | None:
    """(GPUs, GPUs per process) from a table's header: one `#  Rank  N ... device` line per GPU, and
    `nGpus G` (nccl-tests -g, 1 when absent); None when the header does not list the ranks.

    Raises:
        ZsimError: unreadable, not UTF-8 or too large; an nGpus that is not a count dividing the ranks.
    """
    ranks, per_process = 0, None
    # the checked reader (regular file, bounded, UTF-8: ConfigError naming the file), as read_nccl_tests
    for line in read_text(Path(path), what="nccl-tests table", max_bytes=MAX_TABLE_BYTES).splitlines():
        words = line.lstrip("#").split()
        if words[:1] == ["Rank"] and len(words) > 1 and words[1].isdecimal():
            ranks += 1
            if ranks > limit("TABLE_RANKS"):  # checked before a cluster of that size is built and fitted
                raise ConfigError(f"header: {too_many('TABLE_RANKS', ranks, 'ranks listed')}", source=str(path))
        if "nGpus" in words and per_process is None:
            value = (words[words.index("nGpus") + 1:] or [""])[0]
            if not value.isdecimal() or len(value) > 9:  # int() refuses more than 4300 digits
                raise ConfigError(f"header: nGpus {short(value)} is not a count of GPUs", source=str(path))
            per_process = int(value)
    if not ranks:
        return None
    per_process = 1 if per_process is None else per_process
    if not 1 <= per_process <= ranks or ranks % per_process:
        raise ConfigError(f"header: nGpus {per_process} (GPUs per process) does not divide the {ranks} ranks it lists",
                          source=str(path))
    return ranks, per_process


def is_table(path: Path) -> bool:
    """Whether `path` is a text file holding an nccl-tests header line."""
    if not path.is_file() or path.suffix not in (".txt", ".log", ".out"):
        return False
    try:
        with path.open("rb") as fh:
            head = fh.read(MAX_TABLE_BYTES).decode("utf-8", errors="replace")  # bounded: a log is tens of KB
    except OSError:
        return False  # unreadable: not recognised (kind_of then names it an unknown input)
    return any(line.lstrip("#").split()[:3] == ["size", "count", "type"] for line in head.splitlines())

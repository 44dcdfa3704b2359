"""Reading nccl-tests output tables (NVIDIA/nccl-tests, `*_perf -b ... -e ... -f 2`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from zsim.errors import ZsimError


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

    Raises:
        ZsimError: no header or no rows.
    """
    columns: list[str] | None = None
    rows: list[NcclRow] = []
    for line in Path(path).read_text().splitlines():
        words = line.lstrip("#").split()
        if words[:3] == ["size", "count", "type"]:
            columns = words
            continue
        if columns is None or line.startswith("#") or not words or not words[0].isdigit():
            continue
        at = {name: columns.index(name) for name in ("size", "count", "type", "time", "algbw", "busbw")}
        try:
            rows.append(NcclRow(int(words[at["size"]]), int(words[at["count"]]), words[at["type"]],
                                float(words[at["time"]]), float(words[at["algbw"]]), float(words[at["busbw"]])))
        except (ValueError, IndexError):
            continue  # a warning or a truncated line inside the table
    if not rows:
        raise ZsimError(f"{path}: no nccl-tests table found (expected a '# size count type ...' header)")
    return rows

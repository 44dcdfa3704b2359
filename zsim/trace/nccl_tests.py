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


def recording_of(path: Path) -> tuple[int, int] | None:
    """(GPUs, GPUs per process) from a table's header: one `#  Rank  N ... device` line per GPU, and
    `nGpus G` (nccl-tests -g); None when the header does not list them."""
    ranks, per_process = 0, 1
    for line in Path(path).read_text().splitlines():
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

"""Reading nccl-tests output tables (NVIDIA/nccl-tests, `*_perf -b ... -e ... -f 2`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from zsim.config.limits import limit, too_many
from zsim.config.yamlfile import read_text
from zsim.errors import ConfigError, ZsimError, short

MAX_TABLE_BYTES = 16 << 20  # an nccl-tests log is tens of KB
MAX_SIZE = 1 << 44  # 16 TiB: beyond any buffer nccl-tests can allocate


@dataclass(frozen=True, slots=True)
class NcclRow:
    """One out-of-place row: payload S in bytes, time in µs, algbw and busbw in GB/s (10^9 B/s), and
    `wrong`: the elements nccl-tests' own check found wrong (its `#wrong` column; 0 where the table has
    none, or prints N/A with -c 0)."""

    size: int
    count: int
    dtype: str
    time_us: float
    algbw: float
    busbw: float
    wrong: int = field(default=0, kw_only=True)


def read_nccl_tests(path: Path) -> list[NcclRow]:
    """Parse the out-of-place columns of an nccl-tests table. Column positions come from the header
    line (`size count type [redop] [root] time algbw busbw ...`), which differs between collectives.

    Rows whose numbers are not finite, or whose size or time is not positive, are skipped (a
    truncated or edited line). A row nccl-tests' own check failed (`#wrong` > 0: its result was not the
    collective's) is kept with its count; the fits leave it out (`checked`). A `.json` file is `zsim
    collective --json`'s list of rows.

    Raises:
        ZsimError: unreadable, not UTF-8, too large, no header or no rows.
    """
    if Path(path).suffix == ".json":
        return _json_rows(Path(path))
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
                          float(words[at["time"]]), float(words[at["algbw"]]), float(words[at["busbw"]]),
                          wrong=_wrong(words, columns))
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


def _wrong(words: list[str], columns: list[str]) -> int:
    """The out-of-place `#wrong` count of a row (the first such column), 0 without one or for N/A."""
    if "#wrong" not in columns:
        return 0
    value = words[columns.index("#wrong")]
    return int(value) if value.isdigit() else 0


def checked(rows: list[NcclRow] | tuple[NcclRow, ...]) -> tuple[list[NcclRow], list[NcclRow]]:
    """(rows nccl-tests' check passed, rows it failed): a failed row timed a collective whose result was
    wrong (the Alps default tables' SOURCE.md lists four, with Slingshot timeouts beside them), so it is no
    measurement of the collective, and the fits and held-out errors leave it out."""
    return [r for r in rows if not r.wrong], [r for r in rows if r.wrong]


@dataclass(frozen=True, slots=True)
class TableHeader:
    """What an nccl-tests table says about its run: ranks (GPUs), nccl-tests -g (GPUs per process),
    hosts (nodes, from the `# Rank r Pid p on HOST device d` lines) and the column layout: "new"
    (a `#wrong` count per half, nccl-tests since 2021) or "old" (an `error` column: the max relative
    error; some old collectives also lack `root`/`redop`, which `read_nccl_tests` finds by name)."""

    ranks: int
    gpus_per_process: int
    nodes: int
    layout: str

    @property
    def gpus_per_node(self) -> int:
        return self.ranks // self.nodes


def _json_records(path: Path) -> list[dict]:
    """`zsim collective --json`'s rows. Raises ZsimError: not JSON, or not a list of row objects."""
    import json

    try:
        data = json.loads(read_text(path, what="zsim collective JSON", max_bytes=MAX_TABLE_BYTES))
    except json.JSONDecodeError as exc:
        raise ZsimError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, list) or not data or not all(isinstance(r, dict) for r in data):
        raise ZsimError(f"{path}: expected zsim collective --json output, a list of rows")
    return data


def _json_rows(path: Path) -> list[NcclRow]:
    rows = []
    for r in _json_records(path):
        try:
            row = NcclRow(int(r["size"]), int(r["count"]), str(r["dtype"])[:16], float(r["time_us"]),
                          float(r["algbw"]), float(r["busbw"]), wrong=max(0, int(r.get("wrong", 0))))
        except (KeyError, TypeError, ValueError, OverflowError):  # int(1e400) is OverflowError
            continue  # as a damaged text row
        if 0 < row.size <= MAX_SIZE and 0 < row.time_us < math.inf:
            rows.append(row)
    if not rows:
        raise ZsimError(f"{path}: no rows with size, count, dtype, time_us, algbw and busbw")
    return rows


def header_of(path: Path) -> TableHeader | None:
    """The run a table's header describes; None when the header does not list the ranks.

    Ranks are the highest listed rank + 1 (a log may show only some Rank lines, e.g. 0, 7, 8, 15 of
    16); nodes are the distinct hosts of the listed ranks (a partial list must name every host).

    Raises:
        ZsimError: unreadable, not UTF-8 or too large; an nGpus that is not a count dividing the ranks;
            hosts that do not hold the ranks evenly.
    """
    if Path(path).suffix == ".json":  # zsim collective --json: every row says its run
        first = _json_records(Path(path))[0]
        try:
            ranks, nodes, g = int(first["gpus"]), int(first["nodes"]), int(first.get("gpus_per_process", 1))
        except (KeyError, TypeError, ValueError, OverflowError):  # "gpus": 1e400 is int(inf)
            return None
        if not (0 < nodes <= ranks and ranks % nodes == 0 and 0 < g and ranks % g == 0):
            raise ConfigError(f"rows: {ranks} GPUs on {nodes} nodes, {g} per process, is not a run", source=str(path))
        return TableHeader(ranks, g, nodes, "zsim")
    hosts: dict[int, str] = {}
    per_process, layout = None, "new"
    # the checked reader (regular file, bounded, UTF-8: ConfigError naming the file), as read_nccl_tests
    for line in read_text(Path(path), what="nccl-tests table", max_bytes=MAX_TABLE_BYTES).splitlines():
        words = line.lstrip("#").split()
        if words[:1] == ["Rank"] and len(words) > 1 and words[1].isdecimal() and len(words[1]) < 9:
            host = words[words.index("on") + 1] if "on" in words[:-1] else ""
            hosts[int(words[1])] = host
            if len(hosts) > limit("TABLE_RANKS"):  # checked before a cluster of that size is built and fitted
                raise ConfigError(f"header: {too_many('TABLE_RANKS', len(hosts), 'ranks listed')}", source=str(path))
        if "nGpus" in words and per_process is None:
            value = (words[words.index("nGpus") + 1:] or [""])[0]
            if not value.isdecimal() or len(value) > 9:  # int() refuses more than 4300 digits
                raise ConfigError(f"header: nGpus {short(value)} is not a count of GPUs", source=str(path))
            per_process = int(value)
        if words[:3] == ["size", "count", "type"] and "error" in words:
            layout = "old"
    if not hosts:
        return None
    ranks = max(hosts) + 1
    if ranks > limit("TABLE_RANKS"):  # a rank index past the limit, as a count past it above
        raise ConfigError(f"header: {too_many('TABLE_RANKS', ranks, 'ranks (by the highest rank index)')}",
                          source=str(path))
    per_process = 1 if per_process is None else per_process
    if not 1 <= per_process <= ranks or ranks % per_process:
        raise ConfigError(f"header: nGpus {per_process} (GPUs per process) does not divide the {ranks} ranks it lists",
                          source=str(path))
    names = [hosts[r] for r in sorted(hosts)]
    nodes = len(set(names))
    counts = {names.count(h) for h in set(names)} if len(hosts) == ranks else {ranks // nodes}
    if ranks % nodes or len(counts) > 1:
        raise ConfigError(f"header: {ranks} ranks on {nodes} hosts do not split evenly into nodes", source=str(path))
    return TableHeader(ranks, per_process, nodes, layout)


def recording_of(path: Path) -> tuple[int, int] | None:
    """(GPUs, GPUs per process) from a table's header (`header_of`); None when it lists no ranks.

    Raises:
        ZsimError: as `header_of`.
    """
    header = header_of(path)
    return None if header is None else (header.ranks, header.gpus_per_process)


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

"""Reading GEMM timing tables: DeepBench's training GEMM results as CSV
(`source,M,N,K,transA,transB,time_ms,tflops`, ../shared/data/deepbench-v100/).

DeepBench times C = op(A)·op(B) with A M×K and B K×N: 2·M·N·K floating-point operations
(DeepBench gemm_bench.cu reports TFLOPS as 2MNK/t).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from zsim.errors import ConfigError, short
from zsim.trace.samples import ComputeSample

REQUIRED = ("M", "N", "K", "time_ms")
MAX_DIM = 1 << 31  # as zsim.calibrate.gemm_fit.MAX_DIM


def dtype_of(path: Path) -> str:
    """fp16 for tables whose name says fp16/half (tensor cores), else fp32."""
    name = path.name.lower()
    return "fp16" if ("fp16" in name or "half" in name) else ("bf16" if "bf16" in name else "fp32")


def is_gemm_table(path: Path) -> bool:
    """Whether `path` is a CSV whose header has the GEMM columns."""
    if path.suffix.lower() != ".csv" or not path.is_file():
        return False
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            header = next(csv.reader(fh), [])
    except (OSError, UnicodeDecodeError, csv.Error):  # a .csv all the same: read_gemm_table says what is wrong
        return True
    return all(c in header for c in REQUIRED)


def read_gemm_table(path: Path, dtype: str | None = None) -> list[ComputeSample]:
    """Every row as a `gemm` ComputeSample with shape (M, N, K), 2MNK flops and the measured seconds.

    Raises:
        ConfigError: not a regular UTF-8 file of at most 64 MiB, not CSV, missing columns, or a row that
        gemm_row refuses (naming the file, the line and the column).
    """
    import io

    from zsim.config.yamlfile import read_text

    dtype = dtype or dtype_of(path)
    out = []
    # the checked reader: a regular file, bounded, UTF-8 (ConfigError naming the file otherwise)
    text = read_text(path, what="GEMM table (CSV)", max_bytes=64 << 20)
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
        if missing:
            raise ConfigError(f"not a GEMM table: no column(s) {', '.join(missing)} (need {', '.join(REQUIRED)})",
                              source=str(path))
        for row in reader:
            m, n, k, seconds = gemm_row(row, f"line {reader.line_num}", path)
            out.append(ComputeSample("gemm", 2.0 * m * n * k, seconds, dtype, f"{path}:{reader.line_num}",
                                     shape=(m, n, k),
                                     nbytes=float((m * k + k * n + m * n) * (2 if dtype != "fp32" else 4))))
    except csv.Error as exc:
        raise ConfigError(f"not a CSV table: {exc}", source=str(path)) from None
    if not out:
        raise ConfigError("a GEMM table without rows", source=str(path))
    return out


# The shortest GEMM time a table may hold: 1 ns, three orders of magnitude below any kernel a GPU runs
# (a launch alone costs microseconds: NVIDIA, CUDA C++ Best Practices Guide, "Kernel launch overhead").
MIN_TIME_MS = 1e-6


def gemm_row(row: dict[str, str | None], where: str, path: Path) -> tuple[int, int, int, float]:
    """(M, N, K, seconds) of one csv.DictReader row: M, N, K integers 1 to MAX_DIM, time_ms a finite
    number > 0. `where` names the row in messages (`line 41`).

    Raises:
        ConfigError: naming the file, the row and the column: a value missing (a short row), not a
        number, or out of range.
    """
    missing = [c for c in REQUIRED if not (row.get(c) or "").strip()]
    if missing:
        raise ConfigError(f"{where}: no value in column(s) {', '.join(missing)} (a short row?)", source=str(path))
    sizes = []
    for column in ("M", "N", "K"):
        try:
            size = int(row[column])
        except ValueError:
            size = None
        if size is None or not 1 <= size <= MAX_DIM:
            raise ConfigError(f"{where}: {column} {short(row[column])} is not an integer 1 to {MAX_DIM:,}",
                              source=str(path))
        sizes.append(size)
    try:
        time_ms = float(row["time_ms"])
    except ValueError:
        time_ms = math.nan
    if not 0 < time_ms < math.inf:
        raise ConfigError(f"{where}: time_ms {short(row['time_ms'])} is not a finite number > 0", source=str(path))
    if time_ms < MIN_TIME_MS:  # 1e-320 ms: relative errors of 1/time overflow the fit
        raise ConfigError(f"{where}: time_ms {short(row['time_ms'])} is below {MIN_TIME_MS:g} ms (1 ns): not a "
                          "measured GEMM", source=str(path))
    return sizes[0], sizes[1], sizes[2], time_ms * 1e-3

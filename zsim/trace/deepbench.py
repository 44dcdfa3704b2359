"""Reading GEMM timing tables: DeepBench's training GEMM results as CSV
(`source,M,N,K,transA,transB,time_ms,tflops`, ../shared/data/deepbench-v100/).

DeepBench times C = op(A)·op(B) with A M×K and B K×N: 2·M·N·K floating-point operations
(DeepBench gemm_bench.cu reports TFLOPS as 2MNK/t).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from zsim.errors import ConfigError
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
    except (UnicodeDecodeError, csv.Error):  # read_gemm_table says what is wrong with it
        return True
    return all(c in header for c in REQUIRED)


def read_gemm_table(path: Path, dtype: str | None = None) -> list[ComputeSample]:
    """Every row as a `gemm` ComputeSample with shape (M, N, K), 2MNK flops and the measured seconds.

    Raises:
        ConfigError: missing columns, or a row whose numbers do not parse or are not positive (naming
        the file and the line).
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
        for line, row in enumerate(reader, start=2):
            try:
                m, n, k = int(row["M"]), int(row["N"]), int(row["K"])
                seconds = float(row["time_ms"]) * 1e-3
            except (TypeError, ValueError, OverflowError):
                raise ConfigError(f"line {line}: M, N, K, time_ms must be numbers, got "
                                  f"{[row.get(c) for c in REQUIRED]}", source=str(path)) from None
            if min(m, n, k) <= 0 or not 0 < seconds < math.inf:
                raise ConfigError(f"line {line}: sizes and time must be finite and positive", source=str(path))
            if max(m, n, k) > MAX_DIM:
                raise ConfigError(f"line {line}: M, N, K must be at most {MAX_DIM:,}", source=str(path))
            out.append(ComputeSample("gemm", 2.0 * m * n * k, seconds, dtype, f"{path}:{line}", shape=(m, n, k),
                                     nbytes=float((m * k + k * n + m * n) * (2 if dtype != "fp32" else 4))))
    except csv.Error as exc:
        raise ConfigError(f"not a CSV table: {exc}", source=str(path)) from None
    if not out:
        raise ConfigError("a GEMM table without rows", source=str(path))
    return out

"""Reading GEMM timing tables: DeepBench's training GEMM results as CSV
(`source,M,N,K,transA,transB,time_ms,tflops`, ../shared/data/deepbench-v100/).

DeepBench times C = op(A)·op(B) with A M×K and B K×N: 2·M·N·K floating-point operations
(DeepBench gemm_bench.cu reports TFLOPS as 2MNK/t).
"""

from __future__ import annotations

import csv
from pathlib import Path

from zsim.errors import ConfigError
from zsim.trace.samples import ComputeSample

REQUIRED = ("M", "N", "K", "time_ms")


def dtype_of(path: Path) -> str:
    """fp16 for tables whose name says fp16/half (tensor cores), else fp32."""
    name = path.name.lower()
    return "fp16" if ("fp16" in name or "half" in name) else ("bf16" if "bf16" in name else "fp32")


def is_gemm_table(path: Path) -> bool:
    """Whether `path` is a CSV whose header has the GEMM columns."""
    if path.suffix.lower() != ".csv" or not path.is_file():
        return False
    with path.open(newline="") as fh:
        header = next(csv.reader(fh), [])
    return all(c in header for c in REQUIRED)


def read_gemm_table(path: Path, dtype: str | None = None) -> list[ComputeSample]:
    """Every row as a `gemm` ComputeSample with shape (M, N, K), 2MNK flops and the measured seconds.

    Raises:
        ConfigError: missing columns, or a row whose numbers do not parse or are not positive (naming
        the file and the line).
    """
    dtype = dtype or dtype_of(path)
    out = []
    try:
        fh = path.open(newline="")
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror}", source=str(path)) from None
    with fh:
        reader = csv.DictReader(fh)
        missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
        if missing:
            raise ConfigError(f"not a GEMM table: no column(s) {', '.join(missing)} (need {', '.join(REQUIRED)})",
                              source=str(path))
        for line, row in enumerate(reader, start=2):
            try:
                m, n, k = int(row["M"]), int(row["N"]), int(row["K"])
                seconds = float(row["time_ms"]) * 1e-3
            except (TypeError, ValueError):
                raise ConfigError(f"line {line}: M, N, K, time_ms must be numbers, got "
                                  f"{[row.get(c) for c in REQUIRED]}", source=str(path)) from None
            if min(m, n, k) <= 0 or seconds <= 0:
                raise ConfigError(f"line {line}: sizes and time must be positive", source=str(path))
            out.append(ComputeSample("gemm", 2.0 * m * n * k, seconds, dtype, f"{path}:{line}", shape=(m, n, k),
                                     nbytes=float((m * k + k * n + m * n) * (2 if dtype != "fp32" else 4))))
    if not out:
        raise ConfigError("a GEMM table without rows", source=str(path))
    return out

"""Reading XLA's GEMM performance tables as CSV (`b,m,n,k,dtype,flops_per_s,tflops`; ../shared/data/gemm-xla/,
SOURCE.md there gives their provenance).

XLA's generator (openxla/xla xla/tools/matmul_perf_table_gen.cc) times the HLO dot
`[b,m,k] @ [b,k,n] -> [b,m,n]` (m: lhs non-contracting, n: rhs non-contracting, k: contracted) as the
median of 5 kernel times and stores `flops = 2·b·m·n·k / time` ("Every FMA is 2 floating point ops"),
so the time is recovered exactly as 2·b·m·n·k / flops_per_s.

Data types: XLA writes `<lhs>x<rhs>-><out>`. `bf16xbf16->bf16` is bf16 and `f16xf16->f16` fp16.
`f32xf32->f32` is **tf32**: XLA on CUDA runs an f32 dot without a precision_config on TF32 tensor cores
(the generator sets none), and the measured rates prove it (H100: up to 403 TFLOPS against an FP32
peak of 67 and a TF32 peak of 494.5; SOURCE.md, "Plausibility checks").
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

from zsim.errors import ConfigError, short
from zsim.trace.samples import ComputeSample

REQUIRED = ("b", "m", "n", "k", "dtype", "flops_per_s")
MAX_DIM = 1 << 31  # as zsim.trace.deepbench.MAX_DIM
# XLA's dtype strings -> zsim's GEMM dtypes (module docstring). FP8: E4M3 x E4M3 is `fp8`, the forward GEMM of
# Transformer Engine's hybrid recipe (zsim.compute.fp8); the E4M3 x E5M2 rows (its dgrad and wgrad) are read as
# their own dtypes, which zsim prices as fp8.
DTYPES = {"bf16xbf16->bf16": "bf16", "f16xf16->f16": "fp16", "f32xf32->f32": "tf32",
          "f8e4m3fnxf8e4m3fn->bf16": "fp8", "f8e4m3fnxf8e5m2->bf16": "fp8-e4m3xe5m2",
          "f8e5m2xf8e4m3fn->bf16": "fp8-e5m2xe4m3"}
# Operand bytes per element of each zsim dtype an XLA table holds
ELEMENT_BYTES = {"bf16": 2, "fp16": 2, "tf32": 4, "fp8": 1, "fp8-e4m3xe5m2": 1, "fp8-e5m2xe4m3": 1}


def is_xla_table(path: Path) -> bool:
    """Whether `path` is a CSV whose header has XLA's GEMM table columns."""
    if path.suffix.lower() != ".csv" or not path.is_file():
        return False
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            header = next(csv.reader(fh), [])
    except (OSError, UnicodeDecodeError, csv.Error):
        return False
    return all(c in header for c in REQUIRED)


def read_xla_table(path: Path) -> list[ComputeSample]:
    """Every row as a `gemm` ComputeSample: shape (m, n, k, b), 2·b·m·n·k flops, seconds, zsim dtype.

    Raises:
        ConfigError: naming the file, the line and the column: not a regular UTF-8 CSV of at most
        64 MiB, a missing column, a size that is not an integer 1 to 2^31, a dtype not in DTYPES, a
        flops_per_s that is not a finite number > 0, or no rows.
    """
    from zsim.config.yamlfile import read_text

    text = read_text(path, what="XLA GEMM table (CSV)", max_bytes=64 << 20)
    out = []
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
        if missing:
            raise ConfigError(f"not an XLA GEMM table: no column(s) {', '.join(missing)} (need "
                              f"{', '.join(REQUIRED)})", source=str(path))
        for row in reader:
            where = f"line {reader.line_num}"
            b, m, n, k = (_size(row, c, where, path) for c in ("b", "m", "n", "k"))
            dtype = DTYPES.get((row.get("dtype") or "").strip())
            if dtype is None:
                raise ConfigError(f"{where}: dtype {short(row.get('dtype'))} is not one of {', '.join(DTYPES)}",
                                  source=str(path))
            try:
                rate = float(row.get("flops_per_s") or "nan")
            except ValueError:
                rate = math.nan
            if not 0 < rate < math.inf:
                raise ConfigError(f"{where}: flops_per_s {short(row.get('flops_per_s'))} is not a finite number > 0",
                                  source=str(path))
            flops = 2.0 * b * m * n * k
            elem = ELEMENT_BYTES[dtype]
            out.append(ComputeSample("gemm", flops, flops / rate, dtype, f"{path}:{reader.line_num}",
                                     shape=(m, n, k, b), nbytes=float(b * (m * k + k * n + m * n) * elem)))
    except csv.Error as exc:
        raise ConfigError(f"not a CSV table: {exc}", source=str(path)) from None
    if not out:
        raise ConfigError("an XLA GEMM table without rows", source=str(path))
    return out


def _size(row: dict[str, str | None], column: str, where: str, path: Path) -> int:
    try:
        size = int(row.get(column) or "")
    except ValueError:
        size = 0
    if not 1 <= size <= MAX_DIM:
        raise ConfigError(f"{where}: {column} {short(row.get(column))} is not an integer 1 to {MAX_DIM:,}",
                          source=str(path))
    return size

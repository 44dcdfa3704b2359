"""The sweep's table: one row per point (the swept keys, then the result columns), CSV and JSON lines.

Why CSV and JSON lines and not Parquet: a sweep table has thousands of rows, not millions, so a
columnar format buys nothing, while pyarrow would add ~100 MB to every install. CSV opens in any
spreadsheet; JSON lines keeps the types (int, float, null) exactly. `SweepTable.to_pandas()` gives a
DataFrame when pandas is installed (`pd.read_json(path, lines=True)` reads the file as well).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class SweepTable:
    """Rows of a sweep, in point order. A small DataFrame-like object: `len(t)`, `t["step_s"]` (a
    column as a list), `t.rows` (dicts), `t.where(**{"zero.stage": 3})`, `t.to_pandas()`."""

    def __init__(self, columns: list[str], rows: list[dict[str, Any]], keys: list[str] | None = None):
        self.columns = list(columns)
        self.rows = rows
        self.keys = list(keys or [])  # the swept keys (a subset of columns)

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.rows)

    def __getitem__(self, column: str) -> list[Any]:
        if column not in self.columns:
            raise KeyError(f"no column {column!r}; columns: {', '.join(self.columns)}")
        return [r[column] for r in self.rows]

    def __repr__(self) -> str:
        return f"SweepTable({len(self.rows)} rows × {len(self.columns)} columns; swept: {', '.join(self.keys)})"

    def where(self, **equal: Any) -> SweepTable:
        """The rows whose columns equal the given values (dotted keys: `where(**{"zero.stage": 3})`)."""
        for k in equal:
            self[k]  # raises KeyError naming the columns
        return SweepTable(self.columns, [r for r in self.rows if all(r[k] == v for k, v in equal.items())], self.keys)

    def to_pandas(self):
        """A pandas DataFrame of the table (pandas is optional: ImportError says how to install it)."""
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("SweepTable.to_pandas needs pandas: pip install pandas") from None
        return pd.DataFrame(self.rows, columns=self.columns)

    def csv_text(self) -> str:
        """The table as CSV: floats as Python writes them (shortest exact repr), None as empty."""
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(self.columns)
        for r in self.rows:
            writer.writerow(["" if r[c] is None else r[c] for c in self.columns])
        return buf.getvalue()

    def jsonl_text(self) -> str:
        """The table as JSON lines, one object per row, keys in column order."""
        return "".join(json.dumps({c: r[c] for c in self.columns}) + "\n" for r in self.rows)

    @classmethod
    def read_jsonl(cls, path: str | Path, keys: list[str] | None = None) -> SweepTable:
        """Read a table written by `jsonl_text`."""
        rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
        columns = list(rows[0]) if rows else []
        return cls(columns, rows, keys)

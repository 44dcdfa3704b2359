"""The file a CUDA run's allocator history is written to (`python -m zsim.runtime --cuda-memory-history`,
runtime/memory_history.py writes it; zsim.calibrate.memory_history replays it): gzip'd JSON, one row per
allocator action. Here, between the two halves that speak it, as the trace schema is."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

FORMAT = "zsim-memory-history/1"


def read(path: Path) -> dict[str, Any]:
    """A written history (gzip'd JSON). Raises ValueError when `path` is not one."""
    try:
        with gzip.open(path, "rt") as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError, EOFError) as exc:
        raise ValueError(f"{path}: not a readable memory history ({exc})") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{path}: not a zsim memory history (format {FORMAT!r})")
    return data

"""Writing sweep outputs: each file appears whole or not at all (temp file + rename), so a sweep
killed at any moment leaves only complete cache entries behind.

This is the one place sweep code writes files; it is meant to be replaced by the project's shared
atomic writer (contract 6, issue 13) when that lands.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_text(path: Path, text: str) -> Path:
    """Write `text` to `path` atomically (a temp file in the same folder, then os.replace)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path

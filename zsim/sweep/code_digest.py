"""The digest of zsim's own source: part of a sweep point's cache key (zsim.sweep.points.point_key), so that
a cached row is reused only by the code that made it, not by any code that carries the same version string."""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

import zsim

PACKAGE = Path(zsim.__file__).resolve().parent  # the zsim package, as installed or checked out


@lru_cache(maxsize=4)
def code_digest(root: Path = PACKAGE) -> str:
    """sha256 (hex) of every .py file under `root` (its path relative to `root` and its bytes, in path
    order). About 400 files, read once per process. Raises OSError where a file cannot be read."""
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(path.read_bytes() + b"\0")
    return h.hexdigest()

"""A trace file as JSON: read whole, bounded (a file, decompressed, of at most MAX_TRACE_BYTES and the
JSON_BYTES/JSON_VALUES limits; gzip streamed with a cap), and rank lists printed as ranges. The readers
of runtime traces (zsim.trace.run_reader) and Kineto traces (zsim.trace.kineto) share it."""

from __future__ import annotations

import gzip
import json
import os
import stat
import zlib
from pathlib import Path
from typing import Any

from zsim.config.limits import json_values_bound, limit, lift, too_many
from zsim.errors import ConfigError

MAX_TRACE_BYTES = 1 << 31  # one trace file, decompressed: never above this (zsim.config.limits JSON_BYTES, lower, applies)


def load_json(path: Path) -> Any:
    """Parse a JSON or gzipped JSON file of at most MAX_TRACE_BYTES (decompressed).

    Raises:
        ConfigError: not a regular file (a FIFO would be waited on), unreadable, truncated, too large,
        not JSON or nested too deeply (naming the file).
    """
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block, a device never ends
            raise ConfigError("not a regular file, expected a trace", source=str(path))
        cap = min(MAX_TRACE_BYTES, limit("JSON_BYTES"))
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as fh:
            raw = _read_at_most(fh, cap + 1)  # streamed and bounded: a gzip bomb stops here
    except FileNotFoundError:
        raise ConfigError("no such file", source=str(path)) from None
    except (OSError, EOFError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
        raise ConfigError(f"cannot read ({exc}); a truncated or damaged file?", source=str(path)) from None
    if len(raw) > cap:
        raise ConfigError(f"larger than {cap:,} bytes{' decompressed' if path.suffix == '.gz' else ''}: not a trace "
                          f"this reader takes ({lift('JSON_BYTES')})", source=str(path))
    if json_values_bound(raw) > limit("JSON_VALUES"):  # a small file of tiny values parses to many times its size
        raise ConfigError(too_many("JSON_VALUES", json_values_bound(raw), "JSON values (at most)"), source=str(path))
    try:
        return json.loads(raw)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer of more than 4300 digits
        reason = str(exc).split(";")[0][:120]
        raise ConfigError(f"not valid JSON ({reason}); a truncated trace?", source=str(path)) from None
    except RecursionError:
        raise ConfigError("not valid JSON: nested too deeply", source=str(path)) from None


def _read_at_most(fh: Any, limit: int) -> bytearray:
    """Up to `limit` bytes of binary file `fh`, read in 16 MiB pieces (no `limit`-sized buffer up front)."""
    data = bytearray()
    while len(data) < limit:
        piece = fh.read(min(1 << 24, limit - len(data)))
        if not piece:
            break
        data += piece
    return data


def rank_ranges(values: list[int]) -> str:
    """`0-3, 5, 7-8` for [0, 1, 2, 3, 5, 7, 8] (sorted, distinct)."""
    out, start = [], values[0]
    for a, b in zip(values, values[1:] + [None]):
        if b != a + 1:
            out.append(f"{start}" if start == a else f"{start}-{a}")
            start = b
    return ", ".join(out)

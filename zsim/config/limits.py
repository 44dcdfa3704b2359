"""Limits on what one input may cost, each liftable by an environment variable (issue 28).

Every command checks its input against these *before* the work starts, and refuses with one line
that names the limit and how to lift it (`too_many`). A limit is far above real use and low enough
that refusing input costs well under a second and under 1 GB of memory. `ZSIM_MAX_<NAME>=N` (a
positive whole number) lifts or lowers one.

| name | default | what | why this size |
|---|---|---|---|
| SWEEP_POINTS | 10,000 | points of one sweep | planning takes ~2.3 ms and ~13 kB a point (issue 28: 10⁶ points, 38 min, 13 GB): 10k plan in ~25 s |
| JSON_BYTES | 128 MiB | one JSON trace or document, decompressed | Python holds a parsed value in up to ~72 B (a `{}` is 64 B + its 8 B slot, sys.getsizeof) |
| JSON_VALUES | 5,000,000 | values in one JSON document (an upper bound: `,` `[` `{` counted) | 5M × 72 B = 360 MB; a 1000-step, 100-layer runtime trace holds ~1M |
| TABLE_ROWS | 4,000 | data rows of one GEMM or nccl-tests table | gemm-fit took 19.5 s on 2,000 rows here (2 cores); the shared tables have ≤ 750 rows |
| SUITE_STEPS | 2 | `run.steps` of each scenario in `zsim validate paper/megatron --set` | the suites judge one step (their scenarios say 1); `validate paper` took 76 s with 1 step and 185 s with 10 here, and `--set run.steps=1000` grew without bound (issue 28) |
| TABLE_FILES | 256 | multi-node nccl-tests tables in one folder | a cluster's tables are one per collective and node count: 6 × 12 (2 to 2048 nodes) = 72; the shared folders hold ≤ 10; each is read and its cluster built before the fit (3,000 tables ran past 70 s) |
| TABLE_RANKS | 4,096 | ranks an nccl-tests header lists | calibrate took 28 s on the 2,048-rank alps 512-node table and 97 s on 8,192 ranks here |
| SCHEDULE_ITEMS | 4,000,000 | forwards and backwards of all pipeline stages' schedules, 2·pp·m·v, that `zsim memory --scenario` and `zsim trace`'s memory guard walk | ~3.4 µs and ~100 B an item here: 4M in ~14 s; pp 4 with m = 10⁶ micro-batches took 27 s, pp 1024 would take hours |
"""

from __future__ import annotations

import os

from zsim.errors import ConfigError

DEFAULTS = {
    "SWEEP_POINTS": 10_000,
    "JSON_BYTES": 128 << 20,
    "JSON_VALUES": 5_000_000,
    "TABLE_ROWS": 4_000,
    "TABLE_RANKS": 4_096,
    "TABLE_FILES": 256,
    "SCHEDULE_ITEMS": 4_000_000,
    "SUITE_STEPS": 2,
}


def limit(name: str) -> int:
    """The limit `name` (a DEFAULTS key): $ZSIM_MAX_<name> when set, else its default.

    Raises:
        ConfigError: the variable is set but not a positive whole number (naming it and its value).
    """
    variable = f"ZSIM_MAX_{name}"
    text = os.environ.get(variable)
    if text is None or not text.strip():
        return DEFAULTS[name]
    try:
        value = int(text.strip().replace("_", ""))
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"${variable} = {text[:40]!r}: expected a positive whole number")
    return value


def lift(name: str) -> str:
    """How to lift the limit `name`: 'set ZSIM_MAX_<name> to raise it'."""
    return f"set ZSIM_MAX_{name} to raise it"


def too_many(name: str, count: int | float, what: str) -> str:
    """One line: `count` `what`: more than the limit, and how to lift it."""
    shown = f"{count:,.0f}" if count == count and abs(count) != float("inf") else "too many"
    return f"{shown} {what}: more than the limit of {limit(name):,} ({lift(name)})"


def json_values_bound(raw: bytes) -> int:
    """An upper bound on the number of values in the JSON text `raw`, counted at C speed: every value
    but the first of a container follows a ',', and every container opens with '[' or '{' (commas and
    brackets inside strings only raise the bound)."""
    return raw.count(b",") + raw.count(b"[") + raw.count(b"{") + 1

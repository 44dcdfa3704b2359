"""Reading a measured run: the runtime's per-rank trace files (`rank<R>.trace.json`, schema
`zsim-trace/1`, docs/trace-schema.md), checked as a whole before anything uses them.

A run is accepted only if every file parses, is in the zsim schema, is measured, belongs to the
same run (same model, ZeRO options, precision, layout, backend), every rank of the world is there
exactly once, and every rank recorded the same steps. Every event is checked once, here
(`check_events`): a name, finite times >= 0, and args of the types the schema gives, so that
calibration and replay read them as numbers. Anything else is one ConfigError naming the file and
what is wrong: calibration and replay never silently use part of a run.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zsim.errors import ConfigError, printable, short
from zsim.trace.json_file import load_json, rank_ranges
from zsim.trace.schema import COLLECTIVES, SCHEMA

_RANK_FILE = re.compile(r"^rank(\d+)\.trace\.json$")
# Metadata keys that must agree between the files of one run (the rest are per rank: rank, host,
# clock_offset_us, device). `run_id` is one random id per launch (runtime/launch.py; absent in traces
# recorded before issue 28), `seed` tells apart two runs of one configuration recorded before it.
SAME_RUN_KEYS = ("run_id", "seed", "model", "zero", "precision", "world_size", "dp", "mp", "grad_accum", "backend",
                 "params")
MAX_WORLD = 1 << 20  # ranks of one run: far above any runtime run (runtime/config.py MAX_RANKS = 1024)
MAX_STEPS = 1_000_000  # steps, and micro-batches of a step: runtime/config.py MAX_STEPS
MAX_BYTES = 1 << 44  # one collective's payload: as zsim.trace.nccl_tests.MAX_SIZE (16 TiB)
# Span args the readers use, by kind: counts (upper bound) and amounts (finite numbers >= 0).
COUNT_ARGS = {"step": MAX_STEPS, "micro_batch": MAX_STEPS, "seq": 1 << 53, "bytes": MAX_BYTES}
AMOUNT_ARGS = ("flops", "elements", "nested_us", "blocked_us", "wait_us", "last_arrival_ts")
_DTYPES = ("fp16", "bf16", "fp32")
TIMINGS = ("cuda_event", "host")  # how a collective's span was timed, args.timing (docs/trace-schema.md)
# Times (ts, dur, clock offsets) in µs: a double holds 52 fraction bits, so below 2^52 ns = 2^52/1000 µs
# (~52 days) a time keeps nanosecond resolution (IEEE 754 binary64). A trace shifted past it (ts + 1e300)
# would lose every duration to rounding: refused as a damaged trace.
MAX_TIME_US = 2.0**52 / 1000


@dataclass(slots=True)
class MeasuredRun:
    """One measured run: its (shared) metadata and every rank's complete events, by rank."""

    folder: Path
    metadata: dict[str, Any]
    events: dict[int, list[dict[str, Any]]]  # rank -> complete ("X") events
    counters: dict[int, list[dict[str, Any]]]  # rank -> counter ("C") events
    offsets_us: dict[int, float]  # rank -> clock_offset_us

    @property
    def world_size(self) -> int:
        return int(self.metadata["world_size"])

    @property
    def steps(self) -> list[int]:
        return sorted({int(e["args"]["step"]) for e in self.events[0] if "step" in e.get("args", {})})


def is_run_folder(path: Path) -> bool:
    """Whether `path` is a folder holding `rank<R>.trace.json` files."""
    return path.is_dir() and any(_RANK_FILE.match(p.name) for p in path.iterdir())


def read_run(folder: Path) -> MeasuredRun:
    """Read and check every rank's trace in `folder`.

    Raises:
        ConfigError: no trace files; a file truncated, not JSON or not in the zsim schema; a simulated
        trace; a damaged event (check_events) or metadata value; files of different runs; a rank
        missing or twice; ranks that recorded different steps.
    """
    files = _rank_files(folder)
    metadata: dict[str, Any] = {}
    first = files[0]
    events: dict[int, list[dict[str, Any]]] = {}
    counters: dict[int, list[dict[str, Any]]] = {}
    offsets: dict[int, float] = {}
    for path in files:
        doc = load_json(path)
        meta = _rank_metadata(doc, path)
        if path == first:
            metadata = meta
        else:
            _check_same_run(meta, path, metadata, first)
        check_events(doc.get("traceEvents"), path)
        rank = meta["rank"]
        events[rank] = [e for e in doc["traceEvents"] if e["ph"] == "X"]
        counters[rank] = [e for e in doc["traceEvents"] if e["ph"] == "C"]
        offsets[rank] = float(meta.get("clock_offset_us", 0.0))
    _check_world(metadata["world_size"], set(events), folder)
    _check_steps(events, folder)
    return MeasuredRun(folder, metadata, events, counters, offsets)


def _rank_files(folder: Path) -> list[Path]:
    """The `rank<R>.trace.json` files of `folder`, by rank. Raises ConfigError: not a folder, or none."""
    if not folder.is_dir():
        raise ConfigError("not a folder of runtime traces (rank<R>.trace.json)", source=str(folder))
    files = sorted((p for p in folder.iterdir() if _RANK_FILE.match(p.name)),
                   key=lambda p: int(_RANK_FILE.match(p.name).group(1)))
    if not files:
        raise ConfigError("no rank<R>.trace.json files: not a runtime trace folder", source=str(folder))
    return files


def _rank_metadata(doc: Any, path: Path) -> dict[str, Any]:
    """The metadata of one rank's measured trace, its per-rank values checked.

    Raises:
        ConfigError: not the zsim schema; not measured; rank or world_size not integers (world_size 1 to
        MAX_WORLD); a rank the file name does not say; clock_offset_us not a finite number; model or
        zero not mappings, backend not a name.
    """
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        found = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise ConfigError(f"unknown trace format (schema {short(found)}, expected {SCHEMA!r})", source=str(path))
    meta = doc.get("metadata")
    if not isinstance(meta, dict) or meta.get("source") != "measured":
        raise ConfigError("not a measured trace (metadata.source must be 'measured')", source=str(path))
    for key in ("rank", "world_size"):
        if not _integer(meta.get(key), math.inf):
            raise ConfigError(f"metadata.{key} missing or not an integer (got {short(meta.get(key))})",
                              source=str(path))
    if not 1 <= meta["world_size"] <= MAX_WORLD:
        raise ConfigError(f"metadata.world_size {meta['world_size']} is not a world size (1 to {MAX_WORLD:,})",
                          source=str(path))
    if f"rank{meta['rank']}.trace.json" != path.name:
        raise ConfigError(f"file name says rank {_RANK_FILE.match(path.name).group(1)} but metadata.rank is "
                          f"{meta['rank']}", source=str(path))
    offset = meta.get("clock_offset_us", 0.0)
    if not _finite(offset):
        raise ConfigError(f"metadata.clock_offset_us {short(offset)} is not a finite number", source=str(path))
    if abs(offset) > MAX_TIME_US:
        raise ConfigError(f"metadata.clock_offset_us {short(offset)} is not a time within ±{MAX_TIME_US:.3g} µs",
                          source=str(path))
    for key, kind, what in (("model", dict, "a mapping"), ("zero", dict, "a mapping"), ("backend", str, "a name")):
        if key in meta and not isinstance(meta[key], kind):
            raise ConfigError(f"metadata.{key} is {short(meta[key])}, not {what}", source=str(path))
    return meta


def _check_same_run(meta: dict[str, Any], path: Path, reference: dict[str, Any], first: Path) -> None:
    """`meta` (of `path`) agrees with the first file's on every SAME_RUN_KEYS key.

    Raises:
        ConfigError: naming the first differing (dotted) key and both values; blamed on the file whose
        value no run could have written (metadata_value_ok), else on `path`.
    """
    for key in SAME_RUN_KEYS:
        if meta.get(key) != reference.get(key):
            where, mine, theirs = _first_difference(key, meta.get(key), reference.get(key))
            if metadata_value_ok(where, mine) != metadata_value_ok(where, theirs):  # one of them is damaged
                bad, value, other, good = ((path, mine, theirs, first) if metadata_value_ok(where, theirs)
                                           else (first, theirs, mine, path))
                raise ConfigError(f"metadata.{where} is {short(value)}, which no run writes ({good.name} has "
                                  f"{short(other)}): a damaged file", source=str(bad))
            raise ConfigError(f"metadata.{where} is {short(mine)} here but {short(theirs)} in {first.name}: "
                              "files of different runs in one folder, or one damaged", source=str(path))


def _first_difference(key: str, a: Any, b: Any) -> tuple[str, Any, Any]:
    """(dotted key, value in a, value in b) of the first place two metadata values differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        for sub in [*a, *(k for k in b if k not in a)]:
            if a.get(sub) != b.get(sub):
                return _first_difference(f"{key}.{sub}", a.get(sub), b.get(sub))
    return key, a, b


def metadata_value_ok(where: str, value: Any) -> bool:
    """Whether `value` could be the metadata at dotted key `where`: `model.<key>` and `zero.<key>` by the
    scenario schema's field types (zsim.config.schema), the layout's sizes as positive integers,
    precision as a dtype. True for any other key (nothing to judge it by)."""
    import msgspec

    from zsim.config.model_section import ModelSection

    from zsim.config.schema import ZeroSection

    section, _, key = where.partition(".")
    struct = {"model": ModelSection, "zero": ZeroSection}.get(section)
    if struct is not None and key:
        field = next((f for f in msgspec.structs.fields(struct) if f.name == key), None)
        if field is None:
            return True
        try:
            msgspec.convert(value, field.type, strict=True)
        except msgspec.ValidationError:
            return False
        return True
    if where in ("world_size", "dp", "mp", "grad_accum", "params"):
        return _integer(value, math.inf) and value > 0
    if where == "precision":
        return isinstance(value, str) and value in _DTYPES
    return True


def _check_world(world: int, ranks: set[int], folder: Path) -> None:
    """Every rank of `world` has its file, and no file is beyond it.

    Raises:
        ConfigError: ranks missing (listed, without building a set of the world when most are), or rank
        files beyond the world size.
    """
    if world - len(ranks) > 1000:  # say it without listing a million ranks
        raise ConfigError(f"world size {world} but {len(ranks)} rank files: {world - len(ranks):,} ranks have no "
                          "trace file", source=str(folder))
    missing = sorted(set(range(world)) - ranks)
    if missing:
        raise ConfigError(f"ranks {rank_ranges(missing)} of world size {world} have no trace file", source=str(folder))
    extra = sorted(r for r in ranks if r >= world)
    if extra:
        raise ConfigError(f"rank files {extra} beyond world size {world}: files of different runs", source=str(folder))


def _check_steps(events: dict[int, list[dict[str, Any]]], folder: Path) -> None:
    """Every rank recorded the same steps, each ending with its optimizer step.

    Raises:
        ConfigError: no steps (an empty trace); ranks with different steps; a last step without
        optimizer/step (the trace stops mid-step).
    """
    steps = {r: sorted({e["args"]["step"] for e in ev if "step" in e["args"]}) for r, ev in events.items()}
    if not steps[0]:
        raise ConfigError("no events with a step: an empty or truncated trace", source=str(folder / "rank0.trace.json"))
    for r, s in steps.items():
        if s != steps[0]:
            raise ConfigError(f"rank {r} recorded steps {s}, rank 0 {steps[0]}: a truncated trace (did a rank "
                              "fail?)", source=str(folder / f"rank{r}.trace.json"))
        last = [e for e in events[r] if e["name"] == "optimizer/step" and e["args"].get("step") == s[-1]]
        if not last:
            raise ConfigError(f"rank {r}'s step {s[-1]} has no optimizer/step: the trace stops mid-step",
                              source=str(folder / f"rank{r}.trace.json"))


def check_events(trace_events: Any, path: Path) -> None:
    """Check a zsim trace's `traceEvents` once, where it is read (read_run, zsim.runtime.merge,
    simulated traces), so that the rest reads them without checking: every event is a mapping with
    a string `ph` and `name`; spans ("X") and counters ("C") have a finite `ts` >= 0 and mapping
    `args`; spans a finite `dur` >= 0, integer `pid` and `tid`, and args of the schema's types
    (COUNT_ARGS, AMOUNT_ARGS, `op` a collective, `group` ranks or a group's name); counters numbers.

    Raises:
        ConfigError: not a list, or the first bad event: the file, its index and name, the field and value.
    """
    if not isinstance(trace_events, list):
        raise ConfigError(f"no traceEvents list (got {short(trace_events)})", source=str(path))
    for i, event in enumerate(trace_events):
        problem = _event_problem(event)
        if problem is not None:
            name = event.get("name") if isinstance(event, dict) else None
            label = f" ({printable(name, 60)})" if isinstance(name, str) else ""
            raise ConfigError(f"traceEvents[{i}]{label}: {problem}", source=str(path))


def _event_problem(e: Any) -> str | None:
    """What is wrong with one trace event, or None (see check_events)."""
    if not isinstance(e, dict):
        return f"an event must be a mapping, got {short(e)}"
    if not isinstance(e.get("ph"), str):
        return f"ph {short(e.get('ph'))} is not an event type"
    if not isinstance(e.get("name"), str):
        return "has no name"
    if e["ph"] not in ("X", "C"):
        return None  # metadata ("M") and other events: nothing reads their times
    if not _amount(e.get("ts")):
        return f"ts {short(e.get('ts'))} is not a finite number >= 0"
    if e["ts"] > MAX_TIME_US:
        return f"ts {short(e['ts'])} is not a time 0 to {MAX_TIME_US:.3g} µs (a shifted or damaged trace?)"
    if not isinstance(e.get("args"), dict):
        return f"args {short(e.get('args'))} is not a mapping"
    if e["ph"] == "C":
        bad = next((k for k, v in e["args"].items() if not _amount(v)), None)
        return None if bad is None else (f"args.{printable(str(bad), 40)} {short(e['args'][bad])} is not a finite "
                                         "number >= 0")
    if not _amount(e.get("dur")):
        return f"dur {short(e.get('dur'))} is not a finite number >= 0"
    if e["dur"] > MAX_TIME_US:
        return f"dur {short(e['dur'])} is not a duration 0 to {MAX_TIME_US:.3g} µs"
    for key in ("pid", "tid"):
        if not _integer(e.get(key), MAX_WORLD):
            return f"{key} {short(e.get(key))} is not an integer 0 to {MAX_WORLD:,}"
    return _span_args_problem(e["args"])


def _span_args_problem(args: dict[str, Any]) -> str | None:
    """What is wrong with a span's args, or None (see check_events)."""
    for key, limit in COUNT_ARGS.items():
        if key in args and not _integer(args[key], limit):
            return f"args.{key} {short(args[key])} is not an integer 0 to {limit:,}"
    for key in AMOUNT_ARGS:
        if key in args and not _amount(args[key]):
            return f"args.{key} {short(args[key])} is not a finite number >= 0"
    if "op" in args and args["op"] not in COLLECTIVES:
        return f"args.op {short(args['op'])} is not a collective ({', '.join(COLLECTIVES)})"
    if "timing" in args and args["timing"] not in TIMINGS:
        return f"args.timing {short(args['timing'])} is not one of {', '.join(TIMINGS)}"
    if "dtype" in args and not isinstance(args["dtype"], str):
        return f"args.dtype {short(args['dtype'])} is not a type name"
    group = args.get("group", "")
    if not isinstance(group, str) and not (isinstance(group, list) and 0 < len(group) <= MAX_WORLD
                                           and all(_integer(r, MAX_WORLD) for r in group)):
        return f"args.group {short(group)} is not a list of ranks (or a group's name)"
    return None


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _amount(value: Any) -> bool:
    """A finite number >= 0 (not a bool)."""
    return _finite(value) and value >= 0


def _integer(value: Any, limit: float) -> bool:
    """An int (not a bool) from 0 to `limit`."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= limit

"""Reading a measured run: the runtime's per-rank trace files (`rank<R>.trace.json`, schema
`zsim-trace/1`, docs/trace-schema.md), checked as a whole before anything uses them.

A run is accepted only if every file parses, is in the zsim schema, is measured, belongs to the
same run (same model, ZeRO options, precision, layout, backend), every rank of the world is there
exactly once, and every rank recorded the same steps. Anything else is one ConfigError naming the
file and what is wrong: calibration and replay never silently use part of a run.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zsim.errors import ConfigError, printable, short
from zsim.trace.kineto import _ranges, load_json
from zsim.trace.samples import CollectiveSample, ComputeSample
from zsim.trace.schema import SCHEMA

_RANK_FILE = re.compile(r"^rank(\d+)\.trace\.json$")
# Metadata keys that must agree between the files of one run (the rest are per rank: rank, host,
# clock_offset_us, device).
SAME_RUN_KEYS = ("model", "zero", "precision", "world_size", "dp", "mp", "grad_accum", "backend", "params")


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
        trace; files of different runs; a rank missing or twice; ranks that recorded different steps.
    """
    if not folder.is_dir():
        raise ConfigError("not a folder of runtime traces (rank<R>.trace.json)", source=str(folder))
    files = sorted((p for p in folder.iterdir() if _RANK_FILE.match(p.name)),
                   key=lambda p: int(_RANK_FILE.match(p.name).group(1)))
    if not files:
        raise ConfigError("no rank<R>.trace.json files: not a runtime trace folder", source=str(folder))
    metadata: dict[str, Any] | None = None
    first: Path | None = None
    events: dict[int, list[dict[str, Any]]] = {}
    counters: dict[int, list[dict[str, Any]]] = {}
    offsets: dict[int, float] = {}
    for path in files:
        doc = load_json(path)
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
            found = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
            raise ConfigError(f"unknown trace format (schema {found!r}, expected {SCHEMA!r})", source=str(path))
        meta = doc.get("metadata")
        if not isinstance(meta, dict) or meta.get("source") != "measured":
            raise ConfigError("not a measured trace (metadata.source must be 'measured')", source=str(path))
        for key in ("rank", "world_size"):
            if not isinstance(meta.get(key), int):
                raise ConfigError(f"metadata.{key} missing or not an integer", source=str(path))
        rank = meta["rank"]
        if f"rank{rank}.trace.json" != path.name:
            raise ConfigError(f"file name says rank {_RANK_FILE.match(path.name).group(1)} but metadata.rank is "
                              f"{rank}", source=str(path))
        if metadata is None:
            metadata, first = meta, path
        else:
            for key in SAME_RUN_KEYS:
                if meta.get(key) != metadata.get(key):
                    where, mine, theirs = _first_difference(key, meta.get(key), metadata.get(key))
                    raise ConfigError(f"metadata.{where} is {short(mine)} here but {short(theirs)} in {first.name}: "
                                      "files of different runs in one folder, or one damaged", source=str(path))
        trace_events = doc.get("traceEvents")
        if not isinstance(trace_events, list):
            raise ConfigError("no traceEvents list", source=str(path))
        events[rank] = [e for e in trace_events if isinstance(e, dict) and e.get("ph") == "X"]
        counters[rank] = [e for e in trace_events if isinstance(e, dict) and e.get("ph") == "C"]
        _check_events(events[rank], counters[rank], path)
        offsets[rank] = float(meta.get("clock_offset_us", 0.0))
    assert metadata is not None
    world = metadata["world_size"]
    if not 1 <= world <= MAX_WORLD:
        raise ConfigError(f"metadata.world_size {world} is not a world size (1 to {MAX_WORLD:,})", source=str(first))
    if world - len(events) > 1000:  # say it without listing a million ranks
        raise ConfigError(f"world size {world} but {len(events)} rank files: {world - len(events):,} ranks have no "
                          "trace file", source=str(folder))
    missing = sorted(set(range(world)) - set(events))
    if missing:
        raise ConfigError(f"ranks {_ranges(missing)} of world size {world} have no trace file", source=str(folder))
    extra = sorted(set(events) - set(range(world)))
    if extra:
        raise ConfigError(f"rank files {extra} beyond world size {world}: files of different runs", source=str(folder))
    steps = {r: sorted({e["args"]["step"] for e in ev if "step" in e.get("args", {})}) for r, ev in events.items()}
    if not steps[0]:
        raise ConfigError("no events with a step: an empty or truncated trace", source=str(files[0]))
    for r, s in steps.items():
        if s != steps[0]:
            raise ConfigError(f"rank {r} recorded steps {s}, rank 0 {steps[0]}: a truncated trace (did a rank "
                              "fail?)", source=str(folder / f"rank{r}.trace.json"))
        last = [e for e in events[r] if e.get("name") == "optimizer/step" and e["args"].get("step") == s[-1]]
        if not last:
            raise ConfigError(f"rank {r}'s step {s[-1]} has no optimizer/step: the trace stops mid-step",
                              source=str(folder / f"rank{r}.trace.json"))
    return MeasuredRun(folder, metadata, events, counters, offsets)


def _first_difference(key: str, a: Any, b: Any) -> tuple[str, Any, Any]:
    """(dotted key, value in a, value in b) of the first place two metadata values differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        for sub in [*a, *(k for k in b if k not in a)]:
            if a.get(sub) != b.get(sub):
                return _first_difference(f"{key}.{sub}", a.get(sub), b.get(sub))
    return key, a, b


MAX_WORLD = 1 << 20  # ranks of one run: far above any runtime run (runtime/config.py MAX_RANKS = 1024)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_events(spans: list[dict[str, Any]], counters: list[dict[str, Any]], path: Path) -> None:
    """Every span has a name, a finite time and a duration >= 0, and dict args; every counter a finite
    time. Raises ConfigError naming the file, the event and the field (once, where the run is read)."""
    for i, e in enumerate(spans):
        what = f"traceEvents: span {i} ({printable(str(e.get('name')), 60)})"
        if not isinstance(e.get("name"), str):
            raise ConfigError(f"traceEvents: span {i} has no name", source=str(path))
        if not _number(e.get("ts")):
            raise ConfigError(f"{what}: ts {short(e.get('ts'))} is not a finite number", source=str(path))
        if not _number(e.get("dur")) or e["dur"] < 0:
            raise ConfigError(f"{what}: dur {short(e.get('dur'))} is not a finite number >= 0", source=str(path))
        if not isinstance(e.get("args", {}), dict):
            raise ConfigError(f"{what}: args is not a mapping", source=str(path))
    for i, e in enumerate(counters):
        if not _number(e.get("ts")) or not isinstance(e.get("args", {}), dict):
            raise ConfigError(f"traceEvents: counter {i}: needs a finite ts and mapping args", source=str(path))


_DTYPES = {"fp16", "bf16", "fp32"}


def collective_samples(run: MeasuredRun, skipped: dict[str, int] | None = None,
                       shared_us: Callable[[int, dict[str, Any]], float] | None = None) -> list[CollectiveSample]:
    """Every collective of every rank as a transfer time: from the last member's arrival to the end
    (`ts + dur - last_arrival_ts`, written by zsim.runtime.merge), so that waiting for a straggler is not
    fitted as transfer. Each rank's own view is kept (ranks may see the end at slightly different
    moments); MP all-reduces inside the compute track count alike. Calls without information about the
    link (zero bytes, a group of one, no time after the last arrival) are counted in `skipped` by reason.
    `shared_us(rank, event)`, when given, is taken off each transfer: the time a CPU host's collective
    lost sharing the cores with compute (zsim.calibrate.core_sharing).

    Raises:
        ConfigError: a collective without `last_arrival_ts` (an unmerged trace) or without bytes/group.
    """
    out = []
    backend = str(run.metadata.get("backend", "gloo"))
    for rank, events in run.events.items():
        for e in events:
            args = e.get("args", {})
            if "group" not in args or "op" not in args:
                continue
            if "last_arrival_ts" not in args:
                raise ConfigError(f"{e['name']} (step {args.get('step')}) has no last_arrival_ts: the traces were not "
                                  "merged (python -m zsim.runtime.merge DIR)", source=str(run.folder / f"rank{rank}.trace.json"))
            if not isinstance(args.get("bytes"), int) or not isinstance(args["group"], list):
                raise ConfigError(f"{e['name']}: bytes or group missing", source=str(run.folder / f"rank{rank}.trace.json"))
            transfer_us = e["ts"] + e["dur"] - args["last_arrival_ts"]
            if shared_us is not None and transfer_us > 0:
                transfer_us -= shared_us(rank, e)
            reason = ("zero bytes" if args["bytes"] <= 0 else "a group of one rank" if len(args["group"]) < 2
                      else "no time after the last arrival (clock skew)" if transfer_us <= 0 else None)
            if reason:  # no information about the link: counted, reported by calibrate
                if skipped is not None:
                    skipped[reason] = skipped.get(reason, 0) + 1
                continue
            out.append(CollectiveSample(args["op"], args["bytes"], len(args["group"]), transfer_us * 1e-6, backend,
                                        str(run.folder), 1, args.get("dtype", "fp32")))
    return out


def compute_samples(run: MeasuredRun) -> list[ComputeSample]:
    """Every compute phase (`fwd/...`, `bwd/...`, `recompute/...`, `optimizer/step`) of every rank,
    with its FLOPs (from the trace) and measured seconds; the kind is the phase and the module kind
    (`fwd/layer`, `bwd/head`, ...)."""
    dtype = str(run.metadata.get("precision", "fp32"))
    out = []
    for rank, events in run.events.items():
        for e in events:
            if e.get("tid") != 0 or "op" in e.get("args", {}) or e["name"].split("/")[0] not in (
                    "fwd", "bwd", "recompute", "optimizer"):
                continue
            phase, _, what = e["name"].partition("/")
            kind = f"{phase}/{what.split('.')[0]}"
            args = e.get("args", {})
            out.append(ComputeSample(kind, float(args.get("flops", 0.0)), e["dur"] * 1e-6, dtype,
                                     str(run.folder / f"rank{rank}.trace.json"), name=e["name"],
                                     nbytes=float(args.get("elements", 0))))
    return out

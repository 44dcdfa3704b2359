"""Run a planned sweep: reuse cached points, run the missing ones on an engine, assemble the table
and the answers, write the outputs.

Output folder (default out/<sweep name>/):
  sweep.csv, sweep.jsonl   the table (zsim.sweep.table)
  sweep.json               what was swept, counts, skipped reasons, knees, fastest point, file paths
  <metric>-vs-<x>.png/.svg the plot (zsim.sweep.plot)
  cache/<key>.json         one row per finished point, keyed by a hash of its resolved scenario and
                           the zsim version: a rerun (after an interrupt, or with more points) runs
                           only the points whose key is not there, and those whose entry is damaged
                           (zsim.sweep.cache: each entry is checked before it is reused)
  points/<key>/result.json each point's full result facts, only with per_point=True, keyed by the
                           point's key (the table's `key` column) like the cache
The table, sweep.json and the plots are one set, published together (zsim.sweep.files.OutputSwap);
the whole sweep holds the folder's lock (zsim.sweep.files.sweep_lock).
"""

from __future__ import annotations

import contextlib
import errno
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zsim.errors import ConfigError, printable
from zsim.report.outputs import _explain
from zsim.sweep import answers
from zsim.sweep.cache import entry_text, facts_ok, read_entry
from zsim.sweep.engines import ENGINES, default_workers, run_dask, run_local
from zsim.sweep.files import OutputSwap, drop_temporaries, sweep_lock, write_text
from zsim.sweep.points import Plan, Point
from zsim.sweep.row import COLUMNS
from zsim.sweep.spec import cell
from zsim.sweep.table import SweepTable
from zsim.sweep.worker import Finished

SCHEMA = "zsim-sweep/1"


@dataclass(slots=True)
class SweepRun:
    """A finished sweep: its table, answers and bookkeeping."""

    plan: Plan
    table: SweepTable
    out: Path | None
    engine: str
    workers: int
    ran: int  # points simulated now (the rerun ones included)
    cached: int  # points read from the cache
    wall_s: float  # the whole sweep, planning excluded
    run_s: float  # the engine's part: from the first submission to the last row back
    sim_s: float  # Σ of the simulations' own wall time for the points run now (from the workers)
    point_cpu_s: float = 0.0  # Σ CPU seconds the workers spent on those points (simulate + row)
    knees: list[answers.Knee] = field(default_factory=list)
    knee_axis: str | None = None
    best: dict[str, Any] | None = None
    best_with_room: dict[str, Any] | None = None  # the best that fits without a memory caution
    files: dict[str, str] = field(default_factory=dict)
    rerun: int = 0  # points whose cache entry was damaged, run again
    damaged: dict[str, int] = field(default_factory=dict)  # why an entry could not be reused -> count
    plot_error: str | None = None  # why the plot could not be drawn (the tables were written)

    @property
    def overhead_per_point_s(self) -> float | None:
        """Engine overhead per point run: (workers × engine time − Σ simulation time) / points run."""
        if not self.ran:
            return None
        return (self.workers * self.run_s - self.sim_s) / self.ran


def point_facts(out: Path, key: str) -> Path:
    """Where a point's full result facts go with per_point: points/<key>/result.json."""
    return out / "points" / key / "result.json"


def run_sweep(plan: Plan, out: Path | None, *, engine: str = "local", workers: int | None = None,
              address: str | None = None, per_point: bool = False, write: bool = True, lock: bool = True,
              progress: Callable[[int, int], None] | None = None) -> SweepRun:
    """Run every point of `plan` not soundly cached in `out`/cache, then assemble the table (and write
    the outputs when `write`).

    `out` None keeps everything in memory (no cache, no files). `lock` holds the folder's lock for the
    sweep (False when the caller holds it). `progress(done, total)` is called as points finish.
    Raises ZsimError for an unknown engine, an unreachable cluster, a folder another sweep holds, or a
    write that fails (naming the file).
    """
    if engine not in ENGINES:
        raise ConfigError(f"--engine {engine!r}: expected one of {', '.join(ENGINES)}")
    held = sweep_lock(out) if out is not None and lock else contextlib.nullcontext()
    with held:
        if out is not None:  # the lock is held here, by this call or (lock False) by the caller, as `zsim sweep` does
            drop_temporaries(out)  # a killed sweep's half-written files: no other sweep writes here now
        sweep = _run(plan, out, engine, workers, address, per_point, progress)
        if out is not None and write:
            write_outputs(sweep)
    return sweep


def _run(plan: Plan, out: Path | None, engine: str, workers: int | None, address: str | None, per_point: bool,
         progress: Callable[[int, int], None] | None) -> SweepRun:
    started = time.perf_counter()
    workers = workers or default_workers()
    if engine != "dask" or address is None:  # processes of our own: no more than there are points to run
        workers = max(1, min(workers, len(plan.points)))
    cache = out / "cache" if out is not None else None
    rows: dict[int, dict[str, Any]] = {}
    missing: list[Point] = []
    damaged: dict[str, int] = {}
    for p in plan.points:
        row, why = read_entry(cache / f"{p.key}.json", p.key) if cache is not None else (None, None)
        if row is not None and per_point and not facts_ok(point_facts(out, p.key)):
            row, why = None, "its points/<key>/result.json is missing or damaged"
        if why is not None:
            damaged[why] = damaged.get(why, 0) + 1
        if row is None:
            missing.append(p)
        else:
            rows[p.index] = row
    cached = len(rows)
    sim_seconds = [0.0, 0.0]  # wall, CPU
    keys_of = {p.index: p.key for p in missing}

    def on_done(results: list[Finished]) -> None:
        for index, row, full, wall, cpu in results:
            rows[index] = row
            sim_seconds[0] += wall
            sim_seconds[1] += cpu
            if full is not None and out is not None:
                write_text(point_facts(out, keys_of[index]), json.dumps(full, indent=2) + "\n")
            if cache is not None:
                write_text(cache / f"{row['key']}.json", entry_text(row))
        if progress:
            progress(len(rows) - cached, len(missing))

    run_started = time.perf_counter()
    if missing:
        if engine == "dask":
            run_dask(missing, workers, address, per_point, on_done)
        else:
            run_local(missing, workers, per_point, on_done)
    run_s = time.perf_counter() - run_started
    keys = plan.keys
    table_rows = [{"point": p.index, **{k: cell(v) for k, v in p.values.items()}, **{c: rows[p.index][c] for c in COLUMNS}}
                  for p in plan.points]
    table = SweepTable(["point", *keys, *COLUMNS], table_rows, keys)
    sweep = SweepRun(plan=plan, table=table, out=out, engine=engine, workers=workers, ran=len(missing),
                     cached=cached, wall_s=0.0, run_s=run_s, sim_s=sim_seconds[0], point_cpu_s=sim_seconds[1],
                     rerun=sum(damaged.values()), damaged=damaged)
    _answer(sweep)
    sweep.wall_s = time.perf_counter() - started
    return sweep


def knee_axis(plan: Plan) -> str | None:
    """The axis the knees are about: the plot's x, else the first swept key with ≥ 3 positive numbers."""
    if plan.spec.plot:
        return plan.spec.plot.x
    for axis in plan.axes:
        for i, key in enumerate(axis.keys):
            column = [v[i] for v in axis.values]
            if len(column) >= 3 and all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
                                        for v in column):
                return key
    return None


def _answer(sweep: SweepRun) -> None:
    plan, metric = sweep.plan, sweep.plan.spec.metric
    sweep.best = answers.fastest(sweep.table.rows, metric)
    sweep.best_with_room = answers.fastest_with_room(sweep.table.rows, metric)
    x = knee_axis(plan)
    if x is not None and x in plan.keys:
        sweep.knee_axis = x
        sweep.knees = answers.knees(sweep.table.rows, x, metric, [k for k in plan.keys if k not in plan.companions(x)])


def write_outputs(sweep: SweepRun, plot: bool = True) -> None:
    """Write the table, sweep.json and (unless `plot` is false) the plot into `sweep.out`, as one set
    published together (zsim.sweep.files.OutputSwap). The tables are written first; a plot that cannot
    be drawn is reported in `sweep.plot_error` and sweep.json, and never loses them.

    Raises:
        ZsimError: a full disk or an unwritable folder, naming the file (the previous set stays).
    """
    out = sweep.out
    if out is None:
        raise ValueError("write_outputs needs a sweep with an output folder")
    swap = OutputSwap(out)
    try:
        files = {"csv": str(swap.write("sweep.csv", sweep.table.csv_text())),
                 "jsonl": str(swap.write("sweep.jsonl", sweep.table.jsonl_text()))}
        if plot:
            from zsim.sweep.plot import plot_sweep

            try:
                drawn = plot_sweep(sweep, swap.path)
            except OSError as exc:
                if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):  # the disk, not the plot: say so
                    raise _explain(exc, Path(exc.filename) if exc.filename else out) from None
                sweep.plot_error = printable(f"{type(exc).__name__}: {exc}")
            except Exception as exc:  # noqa: BLE001 - any plotting failure: the tables are what matters
                sweep.plot_error = printable(f"{type(exc).__name__}: {exc}")
            else:
                files.update({ext: str(out / Path(p).name) for ext, p in drawn.items()})
        sweep.files = files
        swap.write("sweep.json", json.dumps(summary_facts(sweep), indent=2) + "\n")
        swap.publish()
    except BaseException:
        swap.discard()
        raise


def summary_facts(sweep: SweepRun) -> dict[str, Any]:
    """sweep.json: what was swept and what it answered (keys in docs/sweep.md)."""
    plan = sweep.plan
    statuses = sweep.table["status"]
    return {
        "schema": SCHEMA,
        "name": plan.spec.name or Path(plan.source).stem,
        "source": plan.source,
        "base": str(plan.base),
        "axes": {" + ".join(a.keys): [[cell(x) for x in v] if len(v) > 1 else cell(v[0]) for v in a.values]
                 for a in plan.axes},
        "set": plan.spec.set,
        "metric": plan.spec.metric,
        "better": answers.better(plan.spec.metric),
        "points": {"combinations": plan.total, "valid": len(plan.points), "fits": statuses.count("fits"),
                   "oom": statuses.count("oom"), "ran": sweep.ran, "cached": sweep.cached,
                   "rerun": sweep.rerun, "skipped": sum(plan.skipped.values())},
        "damaged": sweep.damaged,
        "plot_error": sweep.plot_error,
        "skipped": plan.skipped,
        "fastest_that_fits": sweep.best,
        "fastest_with_room": sweep.best_with_room,
        "knee_axis": sweep.knee_axis,
        "knee_gain": answers.KNEE_GAIN,
        "knees": [k.as_dict() for k in sweep.knees],
        "engine": {"name": sweep.engine, "workers": sweep.workers},
        "files": sweep.files,
    }

"""The terminal summary of a sweep: counts, the fastest configuration that fits, the knees, and the
points (all of them when there are few, else the best ones)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from zsim.report.table import format_table
from zsim.sweep.answers import KNEE_GAIN, better, with_room
from zsim.sweep.points import describe

MAX_ROWS = 24
ROW_COLUMNS = ("status", "step_s", "band_low_s", "band_high_s", "comm_share", "exposed_share", "tflops_per_gpu", "reserved_margin_share",
               "bottleneck")


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    return "" if value is None else str(value)


def _table(rows: list[dict[str, Any]], columns: list[str]) -> list[str]:
    """The rows' `columns`, right-aligned but the last (zsim.report.table)."""
    cells = [[_fmt(r[c]) for c in columns] for r in rows]
    return format_table(cells, header=[columns], align=">" * (len(columns) - 1) + "<", indent="    ", gap="  ")


def rerun_command(base: Path, values: dict[str, Any], fixed: dict[str, Any]) -> str:
    """The `zsim run` line that reproduces one point."""
    import os

    import shlex

    base = Path(os.path.relpath(os.path.normpath(base)))
    # quoted where a shell would read the text itself: a list value's brackets and spaces (`[layernorm, moe]`)
    sets = " ".join("--set " + shlex.quote(f"{k}={v if v is not None else 'null'}") for k, v in {**fixed, **values}.items())
    return f"zsim run {shlex.quote(str(base))} {sets}".rstrip()


def _memory_caution(sweep, metric: str) -> list[str]:
    """When the best point's allocator flushes its cache (time the step leaves out), say so and name the
    best point without flushes."""
    best, plan = sweep.best, sweep.plan
    if with_room(best):
        return []
    why = []
    if best["allocator_flushes"]:
        n = best["allocator_flushes"]
        why.append(f"its allocator released its cache {'once' if n == 1 else f'{n} times'} (not timed)")
    lines = [f"  caution   point {best['point']} " + "; ".join(why)]
    room = sweep.best_with_room
    if room is None:
        lines.append("            no point that fits has more room")
    else:
        values = {k: room[k] for k in plan.keys}
        lines.append(f"  with room {metric} {_fmt(room[metric])} at {describe(values)} (point {room['point']}, "
                     f"{room['reserved_margin_share']:.0%} free)")
    return lines


def sweep_summary(sweep) -> str:
    """A few aligned lines about `sweep` (a zsim.sweep.runner.SweepRun)."""
    plan, table, metric = sweep.plan, sweep.table, sweep.plan.spec.metric
    name = plan.spec.name or Path(plan.source).stem
    title = name + (f" — {plan.spec.description}" if plan.spec.description else "")
    shape = " × ".join(f"{len(a)} {' + '.join(a.keys)}" for a in plan.axes) or "1"
    skipped = sum(plan.skipped.values())
    lines = [
        f"zsim sweep · {title}",
        f"  points    {plan.total} = {shape}; {sweep.ran} run, {sweep.cached} cached, {skipped} skipped; "
        f"{sweep.engine} engine, {sweep.workers} worker{'s' if sweep.workers != 1 else ''}, {sweep.wall_s:.1f} s",
    ]
    if sweep.rerun:
        why = "; ".join(f"{n}× {reason}" for reason, n in sweep.damaged.items())
        lines.append(f"  rerun     {sweep.rerun} cached point{'s' if sweep.rerun != 1 else ''} damaged, run again ({why})")
    for reason, n in sorted(plan.skipped.items(), key=lambda kv: -kv[1]):
        lines.append(f"  skipped   {n}× {reason}")
        if reason in plan.skip_examples:
            lines.append(f"            e.g. {plan.skip_examples[reason]}")
    statuses = Counter(table["status"])
    if statuses["oom"]:
        kinds = Counter("model states do not fit" if r["bottleneck"].startswith("memory: model states")
                        else "ran out of memory in the step" for r in table if r["status"] == "oom")
        detail = ", ".join(f"{k}: {n}" for k, n in kinds.items())
        lines.append(f"  memory    {statuses['fits']} fit, {statuses['oom']} OOM ({detail}; OOM points are timed "
                     "as if the GPU had room)")
    best = sweep.best
    direction = "fastest" if metric.endswith("_s") else ("best (highest)" if better(metric) == "max" else "best (lowest)")
    if best is None:
        lines.append(f"  {direction:<9} no point fits")
    else:
        values = {k: best[k] for k in plan.keys}
        lines.append(f"  {direction:<9} {metric} {_fmt(best[metric])} at {describe(values)} (point {best['point']}); "
                     f"{best['bottleneck']}")
        lines.append(f"            {rerun_command(plan.base, values, plan.spec.set)}")
        lines += _memory_caution(sweep, metric)
    if sweep.knee_axis:
        lines.append(f"  knees     {metric} vs {sweep.knee_axis} (beyond the knee a further 2× buys < {KNEE_GAIN:.0%}):")
        for k in sweep.knees:
            group = describe(k.group) or "the curve"
            if k.x is None:
                still = f" (2× still buys {k.last_gain:.1%} at the top)" if k.last_gain is not None else \
                    " (too few points to double)"
                lines.append(f"            {group}: no knee in range{still}")
            else:
                worse = " (worse)" if k.gain_of_doubling < 0 else ""
                lines.append(f"            {group}: {k.x:g} ({metric} {_fmt(k.value)}; 2× more buys "
                             f"{k.gain_of_doubling:.1%}{worse})")
    rows = table.rows
    shown = rows
    note = ""
    if len(rows) > MAX_ROWS:
        sign = -1 if better(metric) == "max" else 1
        fits = [r for r in rows if r["status"] == "fits" and isinstance(r[metric], (int, float))]
        shown = sorted(fits, key=lambda r: (sign * r[metric], r["point"]))[:10]
        note = f" (the 10 best that fit, of {len(rows)}: all are in the table)"
    if shown:
        lines.append(f"  points{note}")
        lines += _table(shown, ["point", *plan.keys, *dict.fromkeys((metric, *ROW_COLUMNS))])
    if sweep.plot_error:
        lines.append(f"  plot      not drawn ({sweep.plot_error}); the tables are written")
    if sweep.files:
        lines.append("  outputs   " + ", ".join(sweep.files.values()) + f", {Path(sweep.files['csv']).parent / 'sweep.json'}")
    # values of free-text keys (a swept `description`) are echoed too: no control character reaches the terminal
    return "\n".join("".join(c if c.isprintable() else "?" for c in line) for line in lines)

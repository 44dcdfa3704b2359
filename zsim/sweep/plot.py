"""The sweep plot: the metric against one axis, one line per value of a second axis, one panel per
combination of the other swept keys; OOM points drawn as red crosses (their step time is what the
step would cost on a GPU with room), knees as circled points. PNG and SVG.

matplotlib is imported inside the function (DESIGN: runs without plots stay fast).
"""

from __future__ import annotations

import math
from itertools import product
from pathlib import Path
from typing import Any

MAX_PANELS = 12
MAX_LINES = 12
LABELS = {"step_s": "step time (s)", "tflops_per_gpu": "TFLOPS per GPU", "comm_share": "DP comm time / step", "exposed_share": "exposed comm / step",
          "tokens_per_s": "tokens/s", "exposed_comm_s": "exposed comm (s)", "percent_of_peak": "% of peak"}


def _numeric(values: list[Any]) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def plot_axes(sweep) -> tuple[str | None, str | None, list[str]]:
    """(x, lines, panel keys) for `sweep`: the plot spec's, else x = the knee axis (or the first
    numeric axis), lines = the next swept key with at most MAX_LINES values."""
    plan = sweep.plan
    keys = plan.keys
    spec = plan.spec.plot
    if spec is not None:  # its keys were checked when the sweep was planned
        x, lines = spec.x, spec.lines
    else:
        x = sweep.knee_axis or next((k for k in keys if _numeric(sweep.table[k])), None)
        distinct = {k: list(dict.fromkeys(sweep.table[k])) for k in keys}
        lines = next((k for k in keys if x is None or k not in plan.companions(x)
                      if 1 < len(distinct[k]) <= MAX_LINES), None)
    moving = set(plan.companions(x) if x else ()) | set(plan.companions(lines) if lines else ())
    panels = [k for k in keys if k not in moving]
    return x, lines, panels


def plot_sweep(sweep) -> dict[str, str]:
    """Draw the sweep's plot into its output folder. Returns {'png': path, 'svg': path}, or {} when
    there is nothing to plot (no numeric axis, or more than MAX_PANELS panels)."""
    x, lines, panels = plot_axes(sweep)
    table = sweep.table
    metric = (sweep.plan.spec.plot.metric if sweep.plan.spec.plot and sweep.plan.spec.plot.metric
              else sweep.plan.spec.metric)
    if x is None or not _numeric(table[x]):
        return {}
    panel_values = [list(dict.fromkeys(table[k])) for k in panels]
    combos = list(product(*panel_values)) or [()]
    if len(combos) > MAX_PANELS:
        return {}
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(3, len(combos))
    rows_n = math.ceil(len(combos) / cols)
    width = 9.0 if cols == 1 else 5.2 * cols
    fig, grid = plt.subplots(rows_n, cols, figsize=(width, 3.2 + 2.6 * rows_n), dpi=110, squeeze=False)
    xs_all = [v for v in table[x] if v > 0] if _numeric(table[x]) else []
    spec = sweep.plan.spec.plot
    log_x = spec.log_x if spec and spec.log_x is not None else bool(xs_all and max(xs_all) >= 8 * min(xs_all))
    ys_all = [v for v in table[metric] if isinstance(v, (int, float)) and v > 0]
    log_y = bool(ys_all and max(ys_all) >= 10 * min(ys_all))
    knees = {tuple(sorted(k.group.items(), key=str)): k for k in sweep.knees} if sweep.knee_axis == x else {}
    line_values = list(dict.fromkeys(table[lines])) if lines else [None]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, combo in zip(grid.flat, combos):
        fixed = dict(zip(panels, combo))
        oom_labeled = False
        for li, lv in enumerate(line_values):
            sel = [r for r in table.rows if all(r[k] == v for k, v in fixed.items()) and (lines is None or r[lines] == lv)
                   and isinstance(r[metric], (int, float))]
            if not sel:
                continue
            sel.sort(key=lambda r: r[x])
            color = colors[li % len(colors)]
            oom = [r for r in sel if r["status"] == "oom"]
            label = (f"{lines} = {lv}" if lines else metric) + (" (OOM)" if len(oom) == len(sel) else "")
            banded = [r for r in sel if metric == "step_s" and r.get("band_low_s") is not None]
            if banded:  # the error band of each point's regime (zsim.validate.band), shaded around the line
                ax.fill_between([r[x] for r in banded], [r["band_low_s"] for r in banded],
                                [r["band_high_s"] for r in banded], color=color, alpha=0.12, linewidth=0,
                                label="error band (held-out published runs)" if li == 0 else None)
            ax.plot([r[x] for r in sel], [r[metric] for r in sel], marker="o", markersize=3, color=color, label=label,
                    linestyle="--" if len(oom) == len(sel) else "-", alpha=0.6 if len(oom) == len(sel) else 1.0)
            if oom:
                ax.plot([r[x] for r in oom], [r[metric] for r in oom], linestyle="none", marker="x", markersize=5,
                        color="red", label=None if oom_labeled else "OOM (time as if it fit)")
                oom_labeled = True
            group = {**fixed, **({lines: lv} if lines else {})}
            knee = knees.get(tuple(sorted(group.items(), key=str)))
            if knee is not None and knee.x is not None:
                ax.plot([knee.x], [knee.value], marker="o", markersize=13, markerfacecolor="none",
                        markeredgecolor=color, markeredgewidth=1.5)
                ax.annotate(f"knee {knee.x:g}", (knee.x, knee.value), textcoords="offset points",
                            xytext=(6, 8 + 9 * li), fontsize=7, color=color)
        if log_x:
            ax.set_xscale("log", base=2)
            ticks = sorted(set(v for v in xs_all))
            ticks = ticks[:: math.ceil(len(ticks) / 9)]
            ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
            ax.minorticks_off()
        if log_y:
            from matplotlib.ticker import FuncFormatter

            ax.set_yscale("log")
            plain = FuncFormatter(lambda v, _: f"{v:g}")
            ax.yaxis.set_major_formatter(plain)
            ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if str(f"{v:g}")[0] in "25" else ""))
        ax.set_xlabel(x)
        ax.set_ylabel(LABELS.get(metric, metric))
        if fixed:
            ax.set_title(", ".join(f"{k}={v}" for k, v in fixed.items()), fontsize=9)
        ax.grid(True, alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        if handles:
            ax.legend(fontsize=7, frameon=False)
    for ax in list(grid.flat)[len(combos):]:
        ax.set_visible(False)
    name = sweep.plan.spec.name or Path(sweep.plan.source).stem
    fig.suptitle(f"{name}: {metric} vs {x}\n○ knee (a further 2× buys < 5%), × OOM", fontsize=10)
    fig.tight_layout()
    stem = sweep.out / f"{metric}-vs-{x.replace('.', '_')}"
    files = {}
    for ext in ("png", "svg"):
        path = stem.with_suffix(f".{ext}")
        tmp = path.with_name(f".{path.name}.tmp")
        fig.savefig(tmp, format=ext)
        tmp.replace(path)
        files[ext] = str(path)
    plt.close(fig)
    return files

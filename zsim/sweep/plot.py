"""The sweep plot: the metric against one axis, one line per value of a second axis, one panel per
combination of the other swept keys; OOM points drawn as red crosses (their step time is what the
step would cost on a GPU with room), knees as circled points (every knee the summary reports on the
plotted x), all panels on one y scale so that they compare at a glance. PNG and SVG.

matplotlib is imported inside the function (DESIGN: runs without plots stay fast).
"""

from __future__ import annotations

import math
from itertools import product
from pathlib import Path
from typing import Any, Callable

MAX_PANELS = 12
MAX_LINES = 12
LABELS = {"step_s": "step time (s)", "tflops_per_gpu": "TFLOPS per GPU", "comm_share": "DP comm time / step", "exposed_share": "exposed comm / step",
          "tokens_per_s": "tokens/s", "exposed_comm_s": "exposed comm (s)", "percent_of_peak": "% of peak"}


def safe_label(text: Any) -> str:
    """`text` as plain text in a label: '$' escaped, so a name or value such as `$\\frac{a}{` is drawn
    as written instead of parsed as mathtext (matplotlib docs, "Writing mathematical expressions":
    an unescaped '$' pair starts math mode, and a malformed one raises when the figure is drawn)."""
    return str(text).replace("$", r"\$")


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


def plot_sweep(sweep, path_of: Callable[[str], Path] | None = None) -> dict[str, str]:
    """Draw the sweep's plot. `path_of(file name)` says where each file goes (default: the sweep's
    output folder). Returns {'png': path, 'svg': path}, or {} when there is nothing to plot (no numeric
    axis, or more than MAX_PANELS panels). Raises whatever matplotlib raises (the caller keeps the
    tables)."""
    drawn = sweep_figure(sweep)
    if drawn is None:
        return {}
    fig, stem = drawn
    import matplotlib.pyplot as plt

    if path_of is None:
        path_of = lambda name: sweep.out / name  # noqa: E731
    files = {}
    try:
        for ext in ("png", "svg"):
            path = path_of(f"{stem.name}.{ext}")
            fig.savefig(path, format=ext)
            files[ext] = str(path)
    finally:
        plt.close(fig)
    return files


def _group_key(group: dict[str, Any], keys: list[str]) -> tuple:
    """A knee's curve as the plot names it: the values of `keys` (panel keys and the line key). A knee's
    group also holds the keys zipped with those (parallel.dp with parallel.mp), which move with them."""
    return tuple(group.get(k) for k in keys)


def sweep_figure(sweep):
    """(the matplotlib Figure of the sweep's plot, the output path without suffix), or None when there is
    nothing to plot (see plot_sweep)."""
    x, lines, panels = plot_axes(sweep)
    table = sweep.table
    metric = (sweep.plan.spec.plot.metric if sweep.plan.spec.plot and sweep.plan.spec.plot.metric
              else sweep.plan.spec.metric)
    if x is None or not _numeric(table[x]):
        return None
    panel_values = [list(dict.fromkeys(table[k])) for k in panels]
    combos = list(product(*panel_values)) or [()]
    if len(combos) > MAX_PANELS:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = min(3, len(combos))
    rows_n = math.ceil(len(combos) / cols)
    width = 9.0 if cols == 1 else 5.2 * cols
    # one y scale for every panel: panels are compared (a stage against another), not read alone
    fig, grid = plt.subplots(rows_n, cols, figsize=(width, 3.2 + 2.6 * rows_n), dpi=110, squeeze=False, sharey=True)
    xs_all = [v for v in table[x] if v > 0] if _numeric(table[x]) else []
    spec = sweep.plan.spec.plot
    log_x = spec.log_x if spec and spec.log_x is not None else bool(xs_all and max(xs_all) >= 8 * min(xs_all))
    ys_all = [v for v in table[metric] if isinstance(v, (int, float)) and v > 0]
    log_y = bool(ys_all and max(ys_all) >= 10 * min(ys_all))
    curve_keys = [*panels, *([lines] if lines else [])]
    knees = {_group_key(k.group, curve_keys): k for k in sweep.knees} if sweep.knee_axis == x else {}
    line_values = list(dict.fromkeys(table[lines])) if lines else [None]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, combo in zip(grid.flat, combos):
        fixed = dict(zip(panels, combo))
        oom_labeled = False
        circled = 0  # knees drawn in this panel: their labels stack upwards
        for li, lv in enumerate(line_values):
            sel = [r for r in table.rows if all(r[k] == v for k, v in fixed.items()) and (lines is None or r[lines] == lv)
                   and isinstance(r[metric], (int, float))]
            if not sel:
                continue
            sel.sort(key=lambda r: r[x])
            color = colors[li % len(colors)]
            oom = [r for r in sel if r["status"] == "oom"]
            label = safe_label(f"{lines} = {lv}" if lines else metric) + (" (OOM)" if len(oom) == len(sel) else "")
            banded = [r for r in sel if metric == "step_s" and r.get("band_low_s") is not None]
            if banded:  # the error band of each point's regime (zsim.report.band), shaded around the line
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
            knee = knees.get(_group_key(group, curve_keys))
            if knee is not None and knee.x is not None:
                ax.plot([knee.x], [knee.value], marker="o", markersize=13, markerfacecolor="none",
                        markeredgecolor=color, markeredgewidth=1.5)
                ax.annotate(f"knee {knee.x:g}", (knee.x, knee.value), textcoords="offset points",
                            xytext=(8, 6 + 9 * circled), fontsize=7, color=color)
                circled += 1
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
        ax.set_xlabel(safe_label(x))
        if ax.get_subplotspec().is_first_col():  # shared y: the other columns repeat neither label nor ticks
            ax.set_ylabel(safe_label(LABELS.get(metric, metric)))
        if fixed:
            ax.set_title(safe_label(", ".join(f"{k}={v}" for k, v in fixed.items())), fontsize=9)
        ax.grid(True, alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        if handles:
            ax.legend(fontsize=7, frameon=False)
    for ax in list(grid.flat)[len(combos):]:
        ax.set_visible(False)
    name = sweep.plan.spec.name or Path(sweep.plan.source).stem
    fig.suptitle(safe_label(f"{name}: {metric} vs {x}") + "\n○ knee (a further 2× buys < 5%), × OOM", fontsize=10)
    fig.tight_layout()
    stem = f"{metric}-vs-{x.replace('.', '_')}"
    return fig, (sweep.out / stem if sweep.out is not None else Path(stem))

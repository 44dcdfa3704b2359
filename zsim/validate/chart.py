"""A validation report as a picture (`zsim validate SUITE --png PATH`): one row per point, its error
(simulated / published − 1, %) as a dot, its tolerance as a grey band around zero, passes in green
and failures in red, grouped by figure. Points checked to a printed digit (Tables 1 and 2, absolute
tolerances) are summed up in one line under the chart instead: dozens of exact rows would hide the
rest, and the checks (orders, trends) are named in the title when they fail. matplotlib is imported
here only, as every plot of zsim does (zsim/report/plots.py)."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

from zsim.validate.report import Report


def report_png(report: Report, path: Path) -> Path:
    """Draw `report` to the PNG `path` (written whole or not at all) and return it."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure  # not pyplot: no GUI backend machinery, no global figures

    rows = [p for p in report.points if not p.absolute]
    exact = [p for p in report.points if p.absolute]
    height = 1.2 + 0.32 * max(1, len(rows))
    fig = Figure(figsize=(9, height), dpi=110)
    ax = fig.subplots()
    labels = []
    for y, p in enumerate(rows):
        band = 100 * p.tolerance
        ax.barh(y, 2 * band, left=-band, height=0.6, color="0.88", linewidth=0)
        color = ("tab:green" if p.passed else "tab:red") if p.judged else "0.45"  # grey: printed, not judged
        if p.error is None:
            ax.text(0, y, "no value", va="center", ha="center", fontsize=7, color=color)
        else:
            ax.plot([100 * p.error], [y], marker="o", color=color)
            ax.annotate(f"{100 * p.error:+.1f}%", (100 * p.error, y), textcoords="offset points", xytext=(6, -3),
                        fontsize=7, color=color)
        labels.append(f"{p.group.split(' — ')[0]}: {p.name}" + ("" if p.judged else " (calibration)"))
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.invert_yaxis()  # the report's order, top to bottom
    ax.set_xlabel("simulated / published − 1 (%); grey: the point's tolerance")
    judged = [p.passed for p in report.points if p.judged] + [c.passed for c in report.checks if c.judged]
    passed, total = sum(judged), len(judged)
    title = f"{report.title}: {passed} of {total} pass"
    if exact:
        title += f"\n({sum(p.passed for p in exact)} of {len(exact)} table rows exact to the printed digit, not drawn)"
    failed = list(dict.fromkeys(c.group for c in report.checks if c.judged and not c.passed))  # each group once
    if failed:  # wrapped to the figure's width: a title line wider than the figure is cut off
        title += "\n" + textwrap.fill("checks that fail (not drawn): " + "; ".join(failed), width=75)
    ax.set_title(title, fontsize=9)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        fig.savefig(partial, format="png")
        os.replace(partial, path)  # readers see the old file or the whole new one, never half of it
    finally:
        partial.unlink(missing_ok=True)
    return path

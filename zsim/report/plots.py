"""Plots. matplotlib is imported here, inside the functions, so that runs without plots stay fast.

Importing matplotlib costs about as much as the whole flagship simulation (~0.5 s of a ~1 s run on
the development machine), so `zsim run` draws memory.png in a detached background process after it
has printed the summary (`memory_png_later`): the plot is drawn from the run's own memory.csv and
result.json (`python -m zsim.report.plots DIR`), which hold every sample of the timeline, so it is
the same picture `memory_timeline_png` draws in-process (`zsim run --plot wait`). The PNG appears
under its final name only when complete (written to a temporary name, then renamed).
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from zsim.memory.ledger import CATEGORIES

if TYPE_CHECKING:  # numpy and matplotlib are imported where a plot is drawn, not by `zsim run` itself
    import numpy as np

    from zsim.engine.result import Result

GB = 1e9
COLORS = {"params": "#4c72b0", "grads": "#dd8452", "optimizer": "#55a868", "activations": "#c44e52",
          "buffers": "#8172b3", "context": "#937860", "fragmentation": "#bbbbbb"}
PNG = "memory.png"
TIMELINE_PNG = "timeline.png"
ERROR_LOG = "memory.png.log"  # what the background process could not draw, if anything


@dataclass(frozen=True)
class MemorySeries:
    """What the memory plot shows: bytes by category (and fragmentation, the top of the stack being
    reserved memory) over simulated seconds, the capacity, both peaks and the OOM if any."""

    times: np.ndarray  # (T,) s
    layers: np.ndarray  # (T, len(CATEGORIES) + 1) bytes: categories, then fragmentation
    end_s: float
    capacity: float
    peak: tuple[float, float]  # allocated (bytes, s)
    reserved_peak: tuple[float, float]  # reserved (bytes, s)
    oom: tuple[float, str] | None  # (s, category)
    title: str
    # Where held-out published runs of the regime would have ended the run: (low s, high s, regime), from
    # result.json's `band` (zsim.report.error_band); None outside every validated regime.
    band: tuple[float, float, str] | None = None


def _band_span(band: dict | None, steps: int) -> tuple[float, float, str] | None:
    """The run's end as the band places it: each step's (low, high) × the steps; None without a band."""
    if not band or band.get("match") == "outside":
        return None
    near = " (nearest regime)" if band["match"] == "nearest" else ""
    return steps * band["step_low_s"], steps * band["step_high_s"], band["regime"] + near


def series_from_result(result: Result) -> MemorySeries:
    import numpy as np

    ledger = result.ledger
    times, rows = ledger.timeline()
    reserved = ledger.reserved_timeline()
    s = result.scenario
    from zsim.report.error_band import band_facts

    band = band_facts(s, result.total_seconds / len(result.step_seconds))
    return MemorySeries(
        times=times, layers=np.column_stack([rows, reserved - rows.sum(axis=1)]),
        end_s=max(result.total_seconds, times[-1] if len(times) else 0.0), capacity=ledger.capacity,
        peak=(ledger.peak, ledger.peak_time), reserved_peak=(ledger.peak_reserved, ledger.peak_reserved_time),
        oom=(ledger.oom.time_s, ledger.oom.category) if ledger.oom else None,
        title=f"{s.name}: memory per GPU (all {s.layout.world} ranks alike), ZeRO stage {s.zero.stage}",
        band=_band_span(band, len(result.step_seconds)))


def series_from_files(folder: Path) -> MemorySeries:
    """The same series from a run's output folder (memory.csv, every sample; result.json)."""
    import numpy as np

    facts = json.loads((folder / "result.json").read_text())
    with (folder / "memory.csv").open(newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader)
        table = np.array([[float(x) for x in row] for row in reader]).reshape(-1, len(header))
    col = {name: i for i, name in enumerate(header)}
    mem = facts["memory"]
    oom = mem.get("oom")
    return MemorySeries(
        times=table[:, col["time_s"]], layers=table[:, [col[c] for c in (*CATEGORIES, "fragmentation")]],
        end_s=max(sum(facts["time"]["step_seconds"]), table[-1, col["time_s"]] if len(table) else 0.0),
        capacity=mem["capacity_bytes"], peak=(mem["peak_bytes"], mem["peak_time_s"]),
        reserved_peak=(mem["reserved_peak_bytes"], mem["reserved_peak_time_s"]),
        oom=(oom["time_s"], oom["category"]) if oom else None,
        title=f"{facts['scenario']['name']}: memory per GPU (all {facts['layout']['gpus']} ranks alike), "
              f"ZeRO stage {facts['zero']['stage']}",
        band=_band_span(facts.get("band"), len(facts["time"]["step_seconds"])))


def memory_timeline_png(result: Result, path: Path) -> Path:
    """Draw `result`'s memory timeline into `path` now."""
    return draw_memory_timeline(series_from_result(result), path)


def draw_memory_timeline(m: MemorySeries, path: Path) -> Path:
    """Draw memory_figure(`m`) into the PNG `path` (whole or not at all). Returns `path`."""
    fig = memory_figure(m)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        fig.savefig(partial, format="png")
        os.replace(partial, path)  # readers see the old file or the whole new one, never half of it
    finally:
        partial.unlink(missing_ok=True)  # interrupted (Ctrl-C) or failed: no half-written file is left
    return path


def memory_figure(m: MemorySeries):
    """A stacked area of memory by category over simulated time, topped by fragmentation (so the top
    of the stack is reserved memory), with the capacity line and both peaks marked: a matplotlib Figure.
    A peak's label reads leftwards from a peak in the right half of the run (an OOM run peaks at its
    failing allocation, often near the end), so it stays inside the axes and off the legend beside them."""
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    from matplotlib.figure import Figure  # not pyplot: no GUI backend machinery, no global figures

    labels = (*CATEGORIES, "fragmentation")
    # Step-shaped series: each state holds until the next change.
    t = np.repeat(np.append(m.times, m.end_s), 2)[1:-1]
    values = np.repeat(m.layers, 2, axis=0) / GB
    fig = Figure(figsize=(10, 4.5), dpi=110)
    ax = fig.subplots()
    ax.stackplot(t, values.T, labels=labels, colors=[COLORS[c] for c in labels], alpha=0.85, linewidth=0)
    cap = m.capacity / GB
    ax.axhline(cap, color="black", linestyle="--", linewidth=1)
    ax.text(0, cap, f" capacity {cap:.1f} GB", va="bottom", ha="left", fontsize=8)
    def leftwards(when: float) -> bool:  # a label from a mark in the right half reads to its left
        return when > 0.5 * m.end_s

    for (value, when), label, offset in ((m.peak, "allocated peak", -14), (m.reserved_peak, "reserved peak", 6)):
        ax.plot([when], [value / GB], marker="v", color="black")
        ax.annotate(f"{label} {value / GB:.1f} GB", (when, value / GB), textcoords="offset points",
                    xytext=(-5 if leftwards(when) else 5, offset), ha="right" if leftwards(when) else "left",
                    fontsize=8)
    if m.oom:
        ax.axvline(m.oom[0], color="red", linewidth=1)
        ax.text(m.oom[0], cap * 0.5, f" OOM ({m.oom[1]}) ", color="red", fontsize=8,
                ha="right" if leftwards(m.oom[0]) else "left")
    right = m.end_s
    if m.band is not None:  # where published runs of this regime would have ended the run (error band)
        low, high, regime = m.band
        ax.axvspan(low, high, color="tab:orange", alpha=0.15, linewidth=0,
                   label=f"run's end by the error band:\n{regime}")
        right = max(right, high)
    ax.set_title(m.title, fontsize=10)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("GB (10⁹ bytes)")
    ax.set_xlim(0, right)
    ax.set_ylim(0, max(cap, m.reserved_peak[0] / GB) * 1.1)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    return fig


def memory_png_later(folder: Path) -> None:
    """Draw `folder`/memory.png from its memory.csv and result.json in a detached process and return
    at once. A memory.png of an earlier run is removed first, so the folder never shows a stale plot;
    if drawing fails, the reason is in memory.png.log."""
    for stale in (folder / PNG, folder / TIMELINE_PNG, folder / ERROR_LOG):
        stale.unlink(missing_ok=True)
    subprocess.Popen([sys.executable, "-m", "zsim.report.plots", str(folder)], stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)


def main(argv: list[str]) -> int:
    """`python -m zsim.report.plots DIR`: draw DIR/memory.png (from memory.csv and result.json) and
    DIR/timeline.png (from trace.json, result.json and memory.csv)."""
    folder = Path(argv[0])
    try:
        draw_memory_timeline(series_from_files(folder), folder / PNG)
        from zsim.report.timeline_plot import RunFiles, timeline_png

        timeline_png(RunFiles(folder), folder / TIMELINE_PNG)
    except Exception as exc:  # a detached process has no terminal: leave the reason beside the plot
        (folder / ERROR_LOG).write_text(f"a plot could not be drawn: {type(exc).__name__}: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

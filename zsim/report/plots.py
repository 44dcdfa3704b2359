"""Plots. matplotlib is imported here, inside the functions, so that runs without plots stay fast."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from zsim.engine.result import Result
from zsim.memory.ledger import CATEGORIES

GB = 1e9
COLORS = {"params": "#4c72b0", "grads": "#dd8452", "optimizer": "#55a868", "activations": "#c44e52",
          "buffers": "#8172b3", "context": "#937860", "fragmentation": "#bbbbbb"}


def memory_timeline_png(result: Result, path: Path) -> Path:
    """A stacked area of memory by category over simulated time, topped by fragmentation (so the top
    of the stack is reserved memory), with the capacity line and both peaks marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ledger = result.ledger
    times, rows = ledger.timeline()
    reserved = ledger.reserved_timeline()
    layers = np.column_stack([rows, reserved - rows.sum(axis=1)])
    labels = (*CATEGORIES, "fragmentation")
    end = max(result.total_seconds, times[-1] if len(times) else 0.0)
    # Step-shaped series: each state holds until the next change.
    t = np.repeat(np.append(times, end), 2)[1:-1]
    values = np.repeat(layers, 2, axis=0) / GB
    fig, ax = plt.subplots(figsize=(10, 4.5), dpi=110)
    ax.stackplot(t, values.T, labels=labels, colors=[COLORS[c] for c in labels], alpha=0.85, linewidth=0)
    cap = ledger.capacity / GB
    ax.axhline(cap, color="black", linestyle="--", linewidth=1)
    ax.text(0, cap, f" capacity {cap:.1f} GB", va="bottom", ha="left", fontsize=8)
    for value, when, label, offset in ((ledger.peak, ledger.peak_time, "allocated peak", -14),
                                       (ledger.peak_reserved, ledger.peak_reserved_time, "reserved peak", 6)):
        ax.plot([when], [value / GB], marker="v", color="black")
        ax.annotate(f"{label} {value / GB:.1f} GB", (when, value / GB), textcoords="offset points",
                    xytext=(5, offset), fontsize=8)
    if ledger.oom:
        ax.axvline(ledger.oom.time_s, color="red", linewidth=1)
        ax.text(ledger.oom.time_s, cap * 0.5, f" OOM ({ledger.oom.category})", color="red", fontsize=8)
    s = result.scenario
    ax.set_title(f"{s.name}: memory per GPU (all {s.layout.world} ranks alike), ZeRO stage {s.zero.stage}", fontsize=10)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("GB (10⁹ bytes)")
    ax.set_xlim(0, end)
    ax.set_ylim(0, max(cap, ledger.peak_reserved / GB) * 1.1)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path

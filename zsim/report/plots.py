"""Plots. matplotlib is imported here, inside the functions, so that runs without plots stay fast."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from zsim.engine.result import Result
from zsim.memory.ledger import CATEGORIES

GB = 1e9
COLORS = {"params": "#4c72b0", "grads": "#dd8452", "optimizer": "#55a868", "activations": "#c44e52",
          "buffers": "#8172b3"}


def memory_timeline_png(result: Result, path: Path) -> Path:
    """A stacked area of memory by category over simulated time, with the capacity and the peak."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    times, rows = result.ledger.timeline()
    end = max(result.total_seconds, times[-1] if len(times) else 0.0)
    # Step-shaped series: each state holds until the next change.
    t = np.repeat(np.append(times, end), 2)[1:-1]
    values = np.repeat(rows, 2, axis=0) / GB
    fig, ax = plt.subplots(figsize=(10, 4.5), dpi=110)
    ax.stackplot(t, values.T, labels=CATEGORIES, colors=[COLORS[c] for c in CATEGORIES], alpha=0.85, linewidth=0)
    cap = result.ledger.capacity / GB
    ax.axhline(cap, color="black", linestyle="--", linewidth=1)
    ax.text(0, cap, f" capacity {cap:.1f} GB", va="bottom", ha="left", fontsize=8)
    ax.plot([result.ledger.peak_time], [result.ledger.peak / GB], marker="v", color="black")
    ax.annotate(f"peak {result.ledger.peak / GB:.1f} GB", (result.ledger.peak_time, result.ledger.peak / GB),
                textcoords="offset points", xytext=(5, 6), fontsize=8)
    if result.ledger.oom:
        ax.axvline(result.ledger.oom.time_s, color="red", linewidth=1)
        ax.text(result.ledger.oom.time_s, cap * 0.5, f" OOM ({result.ledger.oom.category})", color="red", fontsize=8)
    s = result.scenario
    ax.set_title(f"{s.name}: memory per GPU (all {s.layout.world} ranks alike), ZeRO stage {s.zero.stage}", fontsize=10)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("GB (10⁹ bytes)")
    ax.set_xlim(0, end)
    ax.set_ylim(0, max(cap, result.ledger.peak / GB) * 1.1)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path

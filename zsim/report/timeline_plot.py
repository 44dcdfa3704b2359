"""timeline.png: one rank's step at a glance. From top to bottom: where the step's time went (a bar:
compute, MP comm, EP all-to-alls, PP sends and receives, exposed DP comm, exposed offload, other waits), the
compute, comm and offload streams over the step (one box per op, coloured by kind), and memory (allocated and
reserved) beneath.

"Exposed" is measured on the timeline, not assumed: the moments the compute stream is idle inside the
step, attributed to the DP collectives running then, else to EP all-to-alls running beside it
(parallel.ep_overlap), else to host copies running then, else "other" (latency, dependencies). EP all-to-alls
and pipeline sends and receives in line on the compute stream are their own parts (a receive's time includes its
wait for the other stage: the pipeline's bubble). matplotlib is imported inside `timeline_png` only.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from zsim.trace.intervals import length as _length, union as _union
from zsim.engine.result import Result
from zsim.trace.schema import COLLECTIVES
from zsim.zero.ops import EP_GROUPS

GB = 1e9
KIND_COLORS = {"fwd": "#4c72b0", "bwd": "#dd8452", "recompute": "#8c8c8c", "optimizer": "#55a868",
               "all_gather": "#c44e52", "reduce_scatter": "#8172b3", "all_reduce": "#937860",
               "mp": "#da8bc3", "ep": "#2a9d8f", "pp": "#e9c46a", "offload": "#ccb974", "other": "#64b5cd"}
KIND_LABELS = {"mp": "MP collectives", "ep": "EP all-to-alls", "pp": "PP send/recv"}
BAR_COLORS = {"compute": "#4c72b0", "MP comm": "#da8bc3", "EP all-to-all": "#2a9d8f", "PP send/recv": "#e9c46a",
              "exposed DP comm": "#c44e52", "exposed offload": "#ccb974", "other waits": "#cccccc"}
STREAM_ROWS = ("compute", "comm", "offload", "host", "tp")


def _kind(event: dict[str, Any]) -> str:
    name = event["name"]
    head = name.split("/", 1)[0]
    if event["cat"] == "offload" or head == "offload" or name.startswith(("prefetch/activations", "fetch/activations")):
        return "offload"  # Pa+cpu's copies: on their own stream, or in line as DeepSpeed makes them
    group = event["args"].get("group")
    if group in EP_GROUPS and head == "all_to_all":
        return "ep"  # a MoE block's dispatch and combine, in line or beside the other pass (parallel.ep_overlap)
    if group == "pp":
        return "pp"  # a pipeline send or receive, in line (a receive waits for the other stage's send)
    if head in COLLECTIVES and event["cat"] == "compute" and group != "dp":
        return "mp"  # MP collectives (Megatron's all-reduces, Pa's all-gathers) run in line on the compute stream
    return head if head in KIND_COLORS else "other"  # in line DP ones too: the optimizer's 4-byte checks


def _subtract(base: list[tuple[float, float]], cut: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Parts of `base` (a union) not covered by `cut` (a union)."""
    out, j = [], 0
    for a, b in base:
        start = a
        while j < len(cut) and cut[j][1] <= start:
            j += 1
        k = j
        while k < len(cut) and cut[k][0] < b:
            if cut[k][0] > start:
                out.append((start, cut[k][0]))
            start = max(start, cut[k][1])
            k += 1
        if start < b:
            out.append((start, b))
    return out


def step_window(result: Result, step: int) -> tuple[float, float]:
    """(start, end) of simulated step `step`, in seconds."""
    start = sum(result.step_seconds[:step])
    return start, start + result.step_seconds[step]


def time_breakdown(result: Result, step: int = -1) -> dict[str, float]:
    """Seconds of step `step` (default the last): compute kernels, MP comm (in line), and the idle
    time of the compute stream split into exposed DP comm, exposed EP all-to-alls (beside it: parallel.ep_overlap),
    pipeline sends and receives (a receive's time includes its wait for the other stage: the bubble), exposed
    offload and other waits; EP all-to-alls in line are their own part too. DP collectives
    run in line on the compute stream (the optimizer's 4-byte checks) count as exposed DP comm, and
    Pa+cpu's copies in line (DeepSpeed's, zero.cpu_offload_overlap false) as exposed offload."""
    step = step % len(result.step_seconds)
    t0, t1 = step_window(result, step)
    # rank 0's (with pipeline parallelism the events of the other stages' representatives are apart)
    events = [e for e in result.events if e["ph"] == "X" and e["args"].get("step") == step and e["pid"] == 0]
    spans: dict[str, list[tuple[float, float]]] = {s: [] for s in STREAM_ROWS}
    compute = mp = ep = pp = dp_inline = offload_inline = 0.0
    ep_beside: list[tuple[float, float]] = []
    p2p: list[tuple[float, float]] = []  # pipeline sends and receives (the trace draws them on the comm lane)
    for e in events:
        a, b = e["ts"] * 1e-6, (e["ts"] + e["dur"]) * 1e-6
        kind = _kind(e)
        if e["cat"] == "comm" and kind == "ep":
            ep_beside.append((a, b))
        elif e["cat"] == "comm" and kind == "pp":
            p2p.append((a, b))
        else:
            spans[e["cat"]].append((a, b))
        if e["cat"] == "compute":
            if kind == "mp":
                mp += b - a
            elif kind == "ep":
                ep += b - a
            elif kind == "pp":
                pp += b - a
            elif kind in COLLECTIVES:  # a DP collective in line (overlap_comm false, the optimizer's checks)
                dp_inline += b - a
            elif kind == "offload":  # Pa+cpu's copies in line (DeepSpeed's .cpu() and .to(device))
                offload_inline += b - a
            else:
                compute += b - a
    idle = _subtract([(t0, t1)], _union(spans["compute"]))
    comm = _union(spans["comm"])
    dp_exposed = dp_inline + _length(idle) - _length(_subtract(idle, comm))
    rest = _subtract(idle, comm)
    beside = _subtract(rest, _union(ep_beside))
    ep_exposed = _length(rest) - _length(beside)
    unsent = _subtract(beside, _union(p2p))
    pp_exposed = _length(beside) - _length(unsent)
    offload_waits = _length(unsent) - _length(_subtract(unsent, _union(spans["offload"])))
    offload_exposed = offload_inline + offload_waits
    other = max(0.0, _length(idle) - (dp_exposed - dp_inline) - ep_exposed - pp_exposed - offload_waits)
    return {"compute": compute, "MP comm": mp, "EP all-to-all": ep + ep_exposed, "PP send/recv": pp + pp_exposed,
            "exposed DP comm": dp_exposed, "exposed offload": offload_exposed, "other waits": other}


class _FileLedger:
    """The part of a MemoryLedger the plot reads, from a run's memory.csv (every sample)."""

    def __init__(self, folder: Path, capacity: float):
        import csv

        with (folder / "memory.csv").open(newline="") as fh:
            reader = csv.reader(fh)
            header = next(reader)
            table = np.array([[float(x) for x in row] for row in reader]).reshape(-1, len(header))
        col = {name: i for i, name in enumerate(header)}
        from zsim.memory.ledger import CATEGORIES

        self._times = table[:, col["time_s"]]
        self._rows = table[:, [col[c] for c in CATEGORIES]]
        self._reserved = self._rows.sum(axis=1) + table[:, col["fragmentation"]]
        self.capacity = capacity

    def timeline(self):
        return self._times, self._rows

    def reserved_timeline(self):
        return self._reserved


class RunFiles:
    """What `timeline_png` reads of a Result, rebuilt from a run's output folder (result.json,
    trace.json, memory.csv), so that the plot can be drawn by a background process after the summary
    (zsim.report.plots.main)."""

    def __init__(self, folder: Path):
        import json
        from types import SimpleNamespace

        facts = json.loads((folder / "result.json").read_text())
        trace = json.loads((folder / "trace.json").read_text())
        self.events = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("pid", 0) == 0]
        self.step_seconds = facts["time"]["step_seconds"]
        lay = facts["layout"]
        # what timeline_png reads of a Scenario: result.json's layout.dp is the data-parallel replicas (parallel.dp)
        self.scenario = SimpleNamespace(name=facts["scenario"]["name"], zero=SimpleNamespace(stage=facts["zero"]["stage"]),
                                        layout=SimpleNamespace(world=lay["gpus"], mp=lay["mp"]),
                                        parallel=SimpleNamespace(dp=lay["dp"], cp=lay.get("cp", 1)))
        self.ledger = _FileLedger(folder, facts["memory"]["capacity_bytes"])


def timeline_png(result: Result | RunFiles, path: Path, step: int = -1) -> Path:
    """Draw timeline.png for step `step` (default the last) of `result`'s rank 0 (its rank class)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    step = step % len(result.step_seconds)
    t0, t1 = step_window(result, step)
    parts = time_breakdown(result, step)
    fig, (bar, gantt, mem) = plt.subplots(3, 1, figsize=(11, 6.6), dpi=110, sharex=False,
                                          gridspec_kw={"height_ratios": [0.55, 1.6, 1.6]})
    # The time-breakdown bar.
    left = 0.0
    total = t1 - t0
    for name, seconds in parts.items():
        if seconds <= 0:
            continue
        bar.barh(0, seconds, left=left, color=BAR_COLORS[name], edgecolor="white", height=0.6)
        if seconds / total > 0.06:
            bar.text(left + seconds / 2, 0, f"{name}\n{seconds:.3g} s ({seconds / total:.0%})", ha="center",
                     va="center", fontsize=7)
        left += seconds
    bar.set_xlim(0, total)
    bar.set_yticks([])
    bar.set_xlabel("seconds of the step", fontsize=8)
    bar.legend(handles=[Patch(color=c, label=n) for n, c in BAR_COLORS.items()
                        if parts[n] > 0 or n in ("compute", "MP comm", "exposed DP comm")], loc="upper center",
               bbox_to_anchor=(0.5, -0.9), ncol=5, fontsize=7, frameon=False)
    s = result.scenario
    bar.set_title(f"{s.name}: step {step} of rank 0 ({s.layout.world} GPUs alike), {total:.3f} s; ZeRO stage "
                  f"{s.zero.stage}, DP {s.parallel.dp}" + (f" × CP {s.parallel.cp}" if s.parallel.cp > 1 else "") + f" × MP {s.layout.mp}", fontsize=10)
    # The streams (the 'host' lane only where a plan uses it: deepspeed-0.5's copy launches; 'tp' likewise).
    shown = [e for e in result.events if e["ph"] == "X" and e["args"].get("step") == step and e["pid"] == 0]
    rows = [r for r in STREAM_ROWS if r not in ("host", "tp") or any(e["cat"] == r for e in shown)]
    boxes: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for e in shown:
        row = rows.index(e["cat"])
        boxes.setdefault((row, _kind(e)), []).append((e["ts"] * 1e-6 - t0, max(e["dur"] * 1e-6, total * 2e-4)))
    for (row, kind), spans in boxes.items():
        gantt.broken_barh(spans, (len(rows) - 1 - row - 0.4, 0.8), facecolors=KIND_COLORS[kind], linewidth=0)
    gantt.set_yticks(range(len(rows)), list(reversed(rows)))
    gantt.set_xlim(0, total)
    kinds = sorted({k for _, k in boxes}, key=list(KIND_COLORS).index)
    gantt.legend(handles=[Patch(color=KIND_COLORS[k], label=KIND_LABELS.get(k, k)) for k in kinds],
                 loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)
    gantt.set_xlabel("simulated time in the step (s)", fontsize=8)
    # Memory beneath.
    ledger = result.ledger
    times, rows = ledger.timeline()
    if len(times):
        allocated, reserved = rows.sum(axis=1), ledger.reserved_timeline()
        t = np.append(times, max(t1, times[-1])) - t0
        for values, label, color in ((allocated, "allocated", "#4c72b0"), (reserved, "reserved", "#c44e52")):
            mem.step(t, np.append(values, values[-1]) / GB, where="post", label=label, color=color, linewidth=1)
        cap = ledger.capacity / GB
        if cap < 1e6:  # not the roomy GPU of a sweep's OOM point
            mem.axhline(cap, color="black", linestyle="--", linewidth=1, label=f"capacity {cap:.1f} GB")
        mem.set_ylim(0, max(cap if cap < 1e6 else 0, reserved.max() / GB) * 1.1)
    mem.set_xlim(0, total)
    mem.set_ylabel("GB per GPU", fontsize=8)
    mem.set_xlabel("simulated time in the step (s)", fontsize=8)
    mem.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        fig.savefig(partial, format="png")
        plt.close(fig)
        os.replace(partial, path)  # readers see no plot or the whole plot, never half of it
    finally:
        partial.unlink(missing_ok=True)  # interrupted (Ctrl-C) or failed: no half-written file is left
    return path

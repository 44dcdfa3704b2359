"""Replay: a measured run against the simulator's prediction of the same run, op by op.

The measured run (zsim.trace.run_reader.MeasuredRun) is rebuilt as a scenario from its metadata and
simulated; then both traces are measured by the same functions, so like is compared with like:

* every op is lined up by (name, step, micro_batch, occurrence): the k-th `all_gather/params.layer.3`
  of step 1, micro-batch 0 on one side is the k-th on the other (stage 3 gathers a layer twice);
  ops present on one side only and ops whose bytes differ are listed, never dropped;
* step time: the end of a step's optimizer step minus the previous one's, the slowest rank per step;
  the first step (warm-up: allocations, first-touch) is reported but left out of the median;
* exposed communication: time a collective runs while the compute stream is idle (on the comm
  track, or an MP all-reduce in line on the compute track), per step;
* per op kind (`fwd/layer`, `bwd/head`, `all_gather`, ...): median measured and simulated duration,
  and the spread (10th-90th percentile) of the per-op error; a collective's measured duration is its
  transfer (end − last member's arrival), waiting excluded, as the simulator's is;
* peak memory per category, and the model states (params, grads, optimizer) per rank, exact.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zsim.trace.intervals import length as _length, union as _union
from zsim.trace.schema import CATEGORIES

Key = tuple[str, int, int, int]  # name, step, micro_batch, occurrence


def kind_of(name: str) -> str:
    """`fwd/layer.3` → `fwd/layer`; `all_gather/params.layer.3` → `all_gather`; `optimizer/step` stays."""
    head, _, what = name.partition("/")
    if head in ("fwd", "bwd", "recompute"):
        return f"{head}/{what.split('.')[0]}"
    if head == "optimizer":
        return name
    return head


def is_collective(event: dict[str, Any]) -> bool:
    return "op" in event.get("args", {}) and "group" in event.get("args", {})


def is_wait(event: dict[str, Any]) -> bool:
    """Waiting spans the tracer records on their own (for a gather, for the last rank): not ops."""
    return event["name"].startswith("wait")


def keyed(events: list[dict[str, Any]]) -> dict[Key, dict[str, Any]]:
    """Complete events (waiting spans excluded) by (name, step, micro_batch, occurrence)."""
    seen: dict[tuple[str, int, int], int] = defaultdict(int)
    out = {}
    for e in sorted((e for e in events if e.get("ph") == "X" and not is_wait(e)), key=lambda e: e["ts"]):
        args = e.get("args", {})
        base = (e["name"], int(args.get("step", -1)), int(args.get("micro_batch", -1)))
        out[(*base, seen[base])] = e
        seen[base] += 1
    return out


def op_seconds(event: dict[str, Any]) -> float:
    """A measured or simulated op's duration in seconds: a collective's without waiting for the last
    member (`last_arrival_ts` measured, `wait_us` simulated per rank), a compute span's without the
    ops nested in it (`nested_us`: in-line MP all-reduces, a recompute inside a checkpointed backward)."""
    args = event.get("args", {})
    dur = event["dur"] - args.get("nested_us", 0.0)  # a compute span's own time: in-line collectives are ops too
    if "last_arrival_ts" in args:
        dur = event["ts"] + event["dur"] - max(event["ts"], args["last_arrival_ts"])
    elif "wait_us" in args:
        dur -= args["wait_us"]
    return max(dur, 0.0) * 1e-6


def step_ends(events: list[dict[str, Any]]) -> dict[int, float]:
    """step → end of its last optimizer/step event (µs)."""
    ends: dict[int, float] = {}
    for e in events:
        if e.get("ph") == "X" and e["name"] == "optimizer/step":
            step = int(e["args"].get("step", 0))
            ends[step] = max(ends.get(step, 0.0), e["ts"] + e["dur"])
    return ends


def between_steps_us(events: list[dict[str, Any]]) -> dict[int, float]:
    """step → µs during which this rank ran nothing of any step just before step `step` began: from
    the last event of step − 1 ending to the first event of `step` starting (0 where they overlap).
    That time belongs to the harness around the training step (the runtime makes the next batch and
    writes its trace there, runtime/worker.py), not to training: the runtime's own step time
    (summary `step_seconds`, the time of `train_step`) leaves it out, and so do step_seconds and
    the calibration (zsim.calibrate.host_calibration.idle_before)."""
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    for e in events:
        if e.get("ph") != "X" or "step" not in e.get("args", {}):
            continue
        step = int(e["args"]["step"])
        first[step] = min(first.get(step, e["ts"]), e["ts"])
        last[step] = max(last.get(step, 0.0), e["ts"] + e["dur"])
    return {k: max(0.0, first[k] - last[k - 1]) for k in first if k - 1 in last}


def step_seconds(events: list[dict[str, Any]]) -> list[float]:
    """Seconds per step: from the previous step's end (the first event for step 0) to this one's,
    less the time between steps that belongs to the harness (between_steps_us)."""
    ends = step_ends(events)
    harness = between_steps_us(events)
    starts = [e["ts"] for e in events if e.get("ph") == "X"]
    out, previous = [], min(starts) if starts else 0.0
    for step in sorted(ends):
        out.append((ends[step] - previous - harness.get(step, 0.0)) * 1e-6)
        previous = ends[step]
    return out


def _intersection(x: list[tuple[float, float]], y: list[tuple[float, float]]) -> float:
    i = j = 0
    total = 0.0
    while i < len(x) and j < len(y):
        lo, hi = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        total += max(0.0, hi - lo)
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return total


def exposed_comm_seconds(events: list[dict[str, Any]]) -> dict[int, float]:
    """step → seconds during which a collective runs and no compute op does (one rank's events)."""
    comm: dict[int, list] = defaultdict(list)
    compute: dict[int, list] = defaultdict(list)
    for e in events:
        if e.get("ph") != "X" or is_wait(e):
            continue
        step = int(e.get("args", {}).get("step", 0))
        (comm if is_collective(e) else compute)[step].append((e["ts"], e["ts"] + e["dur"]))
    out = {}
    for step, intervals in comm.items():
        c = _union(intervals)
        out[step] = (_length(c) - _intersection(c, _union(compute[step]))) * 1e-6
    return out


def peak_memory(events: list[dict[str, Any]]) -> dict[str, int]:
    """category → the largest value of the `memory` counter (bytes)."""
    peaks: dict[str, int] = {}
    for e in events:
        if e.get("ph") == "C" and e.get("name") == "memory":
            for k, v in e["args"].items():
                peaks[k] = max(peaks.get(k, 0), int(v))
    return {k: peaks[k] for k in CATEGORIES if k in peaks}


@dataclass(slots=True)
class KindRow:
    kind: str
    count: int
    measured_s: float  # median per op
    simulated_s: float
    spread: tuple[float, float]  # 10th and 90th percentile of per-op (simulated / measured − 1)

    @property
    def error(self) -> float:
        return self.simulated_s / self.measured_s - 1.0 if self.measured_s > 0 else float("nan")


@dataclass(slots=True)
class Alignment:
    """Ops lined up across the two runs, and what did not line up."""

    pairs: list[tuple[Key, dict[str, Any], dict[str, Any]]] = field(default_factory=list)
    measured_only: list[Key] = field(default_factory=list)
    simulated_only: list[Key] = field(default_factory=list)
    bytes_differ: list[tuple[Key, int, int]] = field(default_factory=list)


def align(measured: list[dict[str, Any]], simulated: list[dict[str, Any]]) -> Alignment:
    """Line up one measured rank's ops with the simulated rank's (see the module docstring)."""
    m, s = keyed(measured), keyed(simulated)
    out = Alignment()
    for key, event in m.items():
        other = s.get(key)
        if other is None:
            out.measured_only.append(key)
            continue
        out.pairs.append((key, event, other))
        mb, sb = event["args"].get("bytes"), other["args"].get("bytes")
        if mb is not None and mb != sb:
            out.bytes_differ.append((key, mb, sb))
    # A plan's memory-only ops (Op.memory_only: the runtime mirror's `bucket/<module>`, `bwd/head.cast` and
    # `bwd/head.logits`, zsim.zero.step_pass) have no span of their own in a measured run.
    out.simulated_only = [k for k in s if k not in m and not s[k].get("args", {}).get("memory_only")]
    return out


def kind_table(measured_by_rank: dict[int, list[dict[str, Any]]], simulated: list[dict[str, Any]],
               alignment: Alignment) -> list[KindRow]:
    """Per op kind: median durations and the spread of per-op errors. A measured op's duration is
    the median over ranks of that op (ranks time-slice on a shared CPU; the median is robust)."""
    per_rank = [keyed(events) for events in measured_by_rank.values()]
    rows: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for key, _, sim in alignment.pairs:
        durations = [op_seconds(r[key]) for r in per_rank if key in r]
        rows[kind_of(key[0])].append((float(np.median(durations)), op_seconds(sim)))
    out = []
    for kind, pairs in sorted(rows.items()):
        measured = np.array([p[0] for p in pairs])
        simulated = np.array([p[1] for p in pairs])
        ok = measured > 0
        errors = simulated[ok] / measured[ok] - 1.0 if ok.any() else np.array([np.nan])
        out.append(KindRow(kind, len(pairs), float(np.median(measured)), float(np.median(simulated)),
                           (float(np.percentile(errors, 10)), float(np.percentile(errors, 90)))))
    return out


def on_common_clock(events: list[dict[str, Any]], offset_us: float) -> list[dict[str, Any]]:
    """Copies of `events` with `offset_us` added to `ts` (and to `last_arrival_ts`)."""
    out = []
    for e in events:
        c = dict(e)
        c["ts"] = e["ts"] + offset_us
        if "last_arrival_ts" in e.get("args", {}):
            c["args"] = {**e["args"], "last_arrival_ts": e["args"]["last_arrival_ts"] + offset_us}
        out.append(c)
    return out


def slowest_step_seconds(measured_by_rank: dict[int, list[dict[str, Any]]]) -> list[float]:
    """Per step, the slowest rank's step time (on a common clock, steps end when the last rank ends)."""
    per_rank = [step_seconds(events) for events in measured_by_rank.values()]
    return [max(column) for column in zip(*per_rank)]


def judged(values: list[float]) -> list[float]:
    """The steps a comparison uses: all but the first (warm-up), if there is more than one."""
    return values[1:] if len(values) > 1 else values

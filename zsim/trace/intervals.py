"""Time intervals (start, end) in any unit: the union of a set of spans and its length, shared by the
step-timeline breakdown (zsim.report.timeline_plot) and replay's exposed-communication figure
(zsim.calibrate.replay)."""

from __future__ import annotations


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The sorted, non-overlapping union of `intervals`."""
    merged: list[list[float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def length(intervals: list[tuple[float, float]]) -> float:
    """Total length of non-overlapping `intervals`."""
    return sum(b - a for a, b in intervals)


def overlap(lo: float, hi: float, merged: list[tuple[float, float]]) -> float:
    """Length of [lo, hi) covered by `merged` (sorted, non-overlapping: union's output)."""
    return sum(max(0.0, min(hi, b) - max(lo, a)) for a, b in merged if a < hi and b > lo)

"""The answers a sweep gives: the knee of each curve and the fastest configuration that fits.

The knee (issue 11): the smallest x beyond which a further 2× of x buys less than 5% of the metric.
For each sampled x_i with 2·x_i inside the sampled range, the gain of doubling is the improvement
(m(x_i) − m(2·x_i)) / m(x_i) for a metric where lower is better (times), the opposite sign where higher
is better (throughput), with m(2·x_i) interpolated linearly in log2(x) between the sampled points
(x axes such as bandwidth are swept geometrically). A doubling that makes things worse gains < 0. The knee is the first x_i from which every
later gain is below the threshold; a curve that still gains ≥ 5% at its last checkable point has no
knee in the range (said as such, never guessed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

KNEE_GAIN = 0.05  # issue 11: "beyond it a further 2× of the axis buys less than 5%"

# Metrics where more is better; every other numeric column (times, shares, bytes) is better lower.
HIGHER_IS_BETTER = {"tflops_per_gpu", "percent_of_peak", "tokens_per_s"}


def better(metric: str) -> str:
    """'max' or 'min': which way `metric` improves."""
    return "max" if metric in HIGHER_IS_BETTER else "min"


@dataclass(frozen=True, slots=True)
class Knee:
    """The knee of one curve: `group` (the other swept keys' values), the knee's x and metric, and the
    gain a further doubling of x buys there (None when the curve has no knee in range)."""

    group: dict[str, Any]
    x: float | int | None  # as the axis gave it
    value: float | None
    gain_of_doubling: float | None
    last_gain: float | None  # the gain of doubling at the last checkable point (why there is no knee)

    def as_dict(self) -> dict[str, Any]:
        return {"group": self.group, "x": self.x, "value": self.value,
                "gain_of_doubling": self.gain_of_doubling, "last_gain": self.last_gain}


def _interp_log2(xs: list[float], ys: list[float], x: float) -> float:
    """y at x, linear in log2(x) between the sampled points (xs ascending, x inside the range)."""
    lx = math.log2(x)
    for i in range(len(xs) - 1):
        a, b = math.log2(xs[i]), math.log2(xs[i + 1])
        if a <= lx <= b:
            return ys[i] if b == a else ys[i] + (ys[i + 1] - ys[i]) * (lx - a) / (b - a)
    return ys[-1]


def knee_of(xs: list[float], ys: list[float], higher_is_better: bool = False,
            threshold: float = KNEE_GAIN) -> tuple[int | None, list[float]]:
    """(index of the knee or None, the gain of doubling at each checkable point). xs ascending, > 0."""
    sign = -1.0 if higher_is_better else 1.0
    gains = [sign * (ys[i] - _interp_log2(xs, ys, 2 * xs[i])) / abs(ys[i]) if ys[i] else 0.0
             for i in range(len(xs)) if 2 * xs[i] <= xs[-1] * (1 + 1e-12)]
    knee = None
    for i in range(len(gains) - 1, -1, -1):
        if gains[i] >= threshold:
            break
        knee = i
    return knee, gains


def knees(rows: list[dict[str, Any]], x: str, metric: str, group_by: list[str]) -> list[Knee]:
    """The knee of `metric` against `x` for each combination of `group_by` (OOM points included:
    the knee is a property of the curve; a curve whose every point is OOM is still reported)."""
    curves: dict[tuple, list[tuple[float, float]]] = {}
    given: dict[float, Any] = {}  # each x as the axis gave it (an integer axis's knee stays an int)
    for r in rows:
        xv, yv = r.get(x), r.get(metric)
        if not _is_number(xv) or not _is_number(yv) or xv <= 0:
            continue
        given[float(xv)] = xv
        curves.setdefault(tuple(r[k] for k in group_by), []).append((float(xv), float(yv)))
    out = []
    for group, points in curves.items():
        points.sort()
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        index, gains = knee_of(xs, ys, better(metric) == "max")
        labels = dict(zip(group_by, group))
        if index is None:
            out.append(Knee(labels, None, None, None, gains[-1] if gains else None))
        else:
            out.append(Knee(labels, given[xs[index]], ys[index], gains[index], gains[-1]))
    return out


def fastest(rows: list[dict[str, Any]], metric: str) -> dict[str, Any] | None:
    """The best row by `metric` among the points that fit (ties: the first point)."""
    fits = [r for r in rows if r.get("status") == "fits" and _is_number(r.get(metric))]
    if not fits:
        return None
    sign = -1 if better(metric) == "max" else 1
    return min(fits, key=lambda r: (sign * r[metric], r["point"]))


def with_room(row: dict[str, Any]) -> bool:
    """A point whose step time zsim does not caution about: no allocator cache flush (whose time the step
    leaves out). Memory pressure alone is no caution: issue 25 found the misses are not the allocator."""
    return not row.get("allocator_flushes")


def fastest_with_room(rows: list[dict[str, Any]], metric: str) -> dict[str, Any] | None:
    """The best row by `metric` among the points that fit with room (`with_room`)."""
    return fastest([r for r in rows if with_room(r)], metric)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)

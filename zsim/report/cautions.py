"""When a simulated step time should be read as optimistic: how close to capacity a GPU run is, in the
terms of the ZeRO paper's runs that zsim overestimates most (docs/validation.md, "Per run").

The run summary (zsim.report.summary) and the sweep table and summary (zsim.sweep) use the same line.
"""

from __future__ import annotations

# Below this reserved margin (a fraction of capacity) a step time is likely optimistic: of the 22 runs of
# the ZeRO authors' per-run chart, the 16 that zsim places closer to capacity than this ran 9-128% slower
# than simulated (median 36%), the 6 with more room 4-14% (median 7%) (docs/validation.md, "Per run";
# .venv/bin/python benchmarks/chart_errors.py prints these figures, and tests/test_cautions.py holds
# NEAR_CAPACITY_SLOWER to them). A description of those runs, not a fit.
NEAR_CAPACITY = 0.16
NEAR_CAPACITY_SLOWER = (0.09, 1.28, 0.36)  # those 16 runs' error: lowest, highest, median


def margin_share(reserved_peak_bytes: int, capacity_bytes: int) -> float:
    """The reserved margin as a fraction of capacity (negative past it; 1.0 for a zero capacity)."""
    return (capacity_bytes - reserved_peak_bytes) / capacity_bytes if capacity_bytes else 1.0


def near_capacity(share: float, fits: bool, gpu: bool) -> bool:
    """A GPU run that fits with less than NEAR_CAPACITY of its memory left. A CPU host's memory is no
    CUDA caching allocator's, and a run that does not fit has a louder problem."""
    return gpu and fits and share < NEAR_CAPACITY


def slower_words() -> str:
    """What the runs this close did, in words: '9-128% slower than zsim simulates them, median 36%'."""
    low, high, median = NEAR_CAPACITY_SLOWER
    return f"{100 * low:.0f}-{high:.0%} slower than zsim simulates them, median {median:.0%}"

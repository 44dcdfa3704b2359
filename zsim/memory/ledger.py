"""A rank's memory ledger: every allocation and free by category over simulated time."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

CATEGORIES = ("params", "grads", "optimizer", "activations", "buffers")


@dataclass(frozen=True, slots=True)
class OutOfMemory:
    """The first moment a rank's memory exceeded its GPU's capacity."""

    time_s: float
    category: str  # the category of the allocation that pushed it over
    tag: str  # what was allocated
    nbytes: int
    total_bytes: int  # in use after that allocation
    capacity_bytes: int


@dataclass(slots=True)
class MemoryLedger:
    """Bytes in use per category over time, for one rank (class). Times in seconds, sizes in bytes."""

    capacity: int
    totals: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))
    live: dict[str, tuple[str, int]] = field(default_factory=dict)
    times: list[float] = field(default_factory=list)
    rows: list[tuple[int, ...]] = field(default_factory=list)
    peak: int = 0
    peak_time: float = 0.0
    peak_by_category: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))
    oom: OutOfMemory | None = None

    def alloc(self, time: float, category: str, nbytes: int, tag: str) -> None:
        assert category in self.totals, category
        assert nbytes >= 0 and tag not in self.live, (tag, nbytes)
        self.live[tag] = (category, nbytes)
        self.totals[category] += nbytes
        self._record(time)
        total = sum(self.totals.values())
        if total > self.peak:
            self.peak, self.peak_time, self.peak_by_category = total, time, dict(self.totals)
        if total > self.capacity and self.oom is None:
            self.oom = OutOfMemory(time, category, tag, nbytes, total, self.capacity)

    def free(self, time: float, tag: str) -> None:
        category, nbytes = self.live.pop(tag)
        self.totals[category] -= nbytes
        assert self.totals[category] >= 0, (category, self.totals[category])
        self._record(time)

    def _record(self, time: float) -> None:
        row = tuple(self.totals[c] for c in CATEGORIES)
        if self.times and self.times[-1] == time:
            self.rows[-1] = row  # keep the last state of an instant
        else:
            self.times.append(time)
            self.rows.append(row)

    def timeline(self) -> tuple[np.ndarray, np.ndarray]:
        """(times in s, shape (T,)), (bytes per category, shape (T, len(CATEGORIES)))."""
        return np.asarray(self.times, dtype=float), np.asarray(self.rows, dtype=np.int64).reshape(-1, len(CATEGORIES))

"""A rank's memory ledger: every allocation and free by category over simulated time, and what the
caching allocator reserves for them (zsim.memory.allocator), so fragmentation = reserved − allocated.

`allocated` is the bytes of live tensors (the categories' sum); `reserved` is the allocator's segments
plus MD's arenas. An arena (ZeRO §6.3, MD) is one contiguous buffer reserved at the start, outside
the caching allocator; tensors assigned to it are placed in it and never fragment. An arena too small
for the tensors live in it grows to their high-water mark (as if it had been pre-allocated at that
size), so its reserved size is exactly what the run needs.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from zsim.memory.allocator import CachingAllocator

if TYPE_CHECKING:  # numpy only for the array views below: `zsim run` writes its outputs without it
    import numpy as np

# `context`: device memory held outside PyTorch's caching allocator (CUDA context, cuBLAS workspace,
# NCCL's buffers; zsim.memory.context): reserved once at start, never fragmented.
CATEGORIES = ("params", "grads", "optimizer", "activations", "buffers", "context")
COUNTERS = CATEGORIES + ("fragmentation",)
_ROW = operator.itemgetter(*CATEGORIES)  # a timeline row: the totals in CATEGORIES order
ARENA_CATEGORY = {"checkpoints": "activations", "grads": "grads"}  # what an MD arena holds  # the trace's memory counter track (docs/trace-schema.md)


class Request(NamedTuple):
    """One allocation for `MemoryLedger.alloc_many` (zsim.zero.ops.Alloc has the same fields): `nbytes`
    of `category` for `tag`, in MD arena `arena` if not "", else from the caching allocator's pool of
    `stream` ("" = the call's stream)."""

    category: str
    nbytes: int
    tag: str
    arena: str = ""
    stream: str = ""


@dataclass(frozen=True, slots=True)
class OutOfMemory:
    """The first moment a rank's GPU could not hold an allocation: the caching allocator could not
    reserve a segment for it within capacity, even after releasing its cache."""

    time_s: float
    category: str  # the category of the allocation that did not fit
    tag: str  # what was allocated
    nbytes: int
    total_bytes: int  # allocated (live tensors) after that allocation
    reserved_bytes: int  # reserved by the allocator, the new segment included
    capacity_bytes: int


@dataclass(slots=True)
class Arena:
    """An MD buffer: `size` bytes reserved once, `used` by the tensors placed in it."""

    size: int
    used: int = 0


@dataclass(slots=True)
class MemoryLedger:
    """Bytes in use per category over time, for one rank (class). Times in seconds, sizes in bytes.
    `capacity` None means unbounded and no allocator (host memory)."""

    capacity: int | None
    allocator: CachingAllocator | None = None
    arenas: dict[str, Arena] = field(default_factory=dict)
    totals: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))
    live: dict[str, tuple[str, int, str]] = field(default_factory=dict)  # tag -> (category, bytes, arena or "")
    times: list[float] = field(default_factory=list)
    rows: list[tuple[int, ...]] = field(default_factory=list)
    reserved_rows: list[int] = field(default_factory=list)
    peak: int = 0
    peak_time: float = 0.0
    peak_by_category: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))
    peak_reserved: int = 0
    peak_reserved_time: float = 0.0
    oom: OutOfMemory | None = None
    flush_times: list[float] = field(default_factory=list)  # when the allocator released its cache (s)

    def __post_init__(self) -> None:
        if self.capacity is not None and self.allocator is None:
            self.allocator = CachingAllocator(self.capacity)

    @property
    def allocated(self) -> int:
        return sum(self.totals.values())

    @property
    def reserved(self) -> int:
        return self.allocator.reserved if self.allocator else self.allocated

    def reserve_arena(self, time: float, name: str, nbytes: int) -> None:
        """MD: reserve a contiguous arena `name` of `nbytes` now (it stays for the whole run)."""
        assert name not in self.arenas, name
        self.arenas[name] = Arena(0)
        self._grow(time, name, nbytes, ARENA_CATEGORY.get(name, "buffers"), f"arena.{name}")
        self._record(time)

    def reserve_context(self, time: float, name: str, nbytes: int) -> None:
        """Device memory that the CUDA runtime or a library (NCCL, cuBLAS) holds outside the caching
        allocator for the whole run: counted in category `context`, allocated and reserved alike."""
        if self.allocator is not None and not self.allocator.reserve_outside(nbytes) and self.oom is None:
            self.oom = OutOfMemory(time, "context", name, nbytes, self.allocated + nbytes,
                                   self.allocator.reserved, self.allocator.capacity)
        self.live[name] = ("context", nbytes, "outside")
        self.totals["context"] += nbytes
        self._record(time)

    def _grow(self, time: float, name: str, nbytes: int, category: str, tag: str) -> None:
        arena = self.arenas[name]
        if nbytes > arena.size and self.allocator is not None:
            if not self.allocator.reserve_outside(nbytes - arena.size) and self.oom is None:
                self.oom = OutOfMemory(time, category, tag, nbytes - arena.size, self.allocated,
                                       self.allocator.reserved, self.allocator.capacity)
        arena.size = max(arena.size, nbytes)

    def alloc(self, time: float, category: str, nbytes: int, tag: str, arena: str = "", stream: str = "compute") -> None:
        """Allocate `nbytes` of `category` for `tag`: in MD arena `arena` if given, else from the caching
        allocator's pool of `stream`."""
        self.alloc_many(time, (Request(category, nbytes, tag, arena),), stream)

    def alloc_many(self, time: float, requests: Iterable[Request], stream: str = "compute") -> None:
        """Allocate each of `requests` in order at `time` (its own stream, or `stream` where it names
        none), as `alloc` does one by one, and record the timeline once: the state after the last one
        (the timeline keeps one state per instant) and the peaks of the states in between."""
        totals, live, allocator = self.totals, self.live, self.allocator
        high = self.peak_reserved
        for r in requests:
            category, nbytes, tag, arena = r.category, r.nbytes, r.tag, r.arena
            assert category in totals, category
            assert nbytes >= 0 and tag not in live, (tag, nbytes)
            place = ""
            pool = self.arenas.get(arena) if arena else None
            if pool is not None:
                self._grow(time, arena, pool.used + nbytes, category, tag)
                pool.used += nbytes
                place = arena
            elif allocator is not None and nbytes:
                if not allocator.malloc(tag, nbytes, r.stream or stream) and self.oom is None:
                    self.oom = OutOfMemory(time, category, tag, nbytes, self.allocated + nbytes,
                                           allocator.reserved, allocator.capacity)
            if allocator is not None and allocator.reserved > high:  # a release of the cache may follow
                high = allocator.reserved
            live[tag] = (category, nbytes, place)
            totals[category] += nbytes
        # Totals only grow here, so the last state holds the peak of allocated memory and of
        # `reserved` without an allocator; `high` keeps the allocator's highest reservation.
        total = self._record(time, high)
        if total > self.peak:
            self.peak, self.peak_time, self.peak_by_category = total, time, dict(totals)

    def free(self, time: float, tag: str) -> None:
        self.free_many(time, (tag,))

    def free_many(self, time: float, tags: Iterable[str]) -> None:
        """Free `tags` in order at `time` and record the timeline once (frees change no peak)."""
        totals, live, allocator = self.totals, self.live, self.allocator
        for tag in tags:
            category, nbytes, place = live.pop(tag)
            assert place != "outside", f"{tag} is held for the whole run"
            if place:
                self.arenas[place].used -= nbytes
            elif allocator is not None and nbytes:
                allocator.free(tag)
            totals[category] -= nbytes
            assert totals[category] >= 0, (category, totals[category])
        self._record(time)

    def reset_peaks(self) -> None:
        """Peaks from now on: the allocated and reserved peaks become the current values, as
        torch.cuda.reset_peak_memory_stats() makes them (the runtime calls it after setup)."""
        self.peak, self.peak_by_category = self.allocated, dict(self.totals)
        self.peak_reserved = self.reserved
        self.peak_time = self.peak_reserved_time = self.times[-1] if self.times else 0.0

    def counters(self) -> dict[str, int]:
        """The memory counter values now: bytes per category and fragmentation (reserved − allocated)."""
        values = dict(self.totals)
        values["fragmentation"] = self.reserved - self.allocated
        return values

    def _record(self, time: float, high: int = 0) -> int:
        """Append the state now to the timeline (replacing the last one at the same instant) and keep
        the peak of `reserved` (or `high`, a higher reservation since the last record). Returns the
        allocated bytes."""
        row = _ROW(self.totals)
        allocator = self.allocator
        if allocator is not None and allocator.flushes > len(self.flush_times):
            self.flush_times += [time] * (allocator.flushes - len(self.flush_times))
        reserved = allocator.reserved if allocator is not None else sum(row)
        if max(reserved, high) > self.peak_reserved:
            self.peak_reserved, self.peak_reserved_time = max(reserved, high), time
        times = self.times
        if times and times[-1] == time:
            self.rows[-1] = row  # keep the last state of an instant
            self.reserved_rows[-1] = reserved
        else:
            times.append(time)
            self.rows.append(row)
            self.reserved_rows.append(reserved)
        return sum(row)

    def timeline(self) -> tuple[np.ndarray, np.ndarray]:
        """(times in s, shape (T,)), (bytes per category, shape (T, len(CATEGORIES)))."""
        import numpy as np

        return np.asarray(self.times, dtype=float), np.asarray(self.rows, dtype=np.int64).reshape(-1, len(CATEGORIES))

    def reserved_timeline(self) -> np.ndarray:
        """Reserved bytes at each time of `timeline()`, shape (T,)."""
        import numpy as np

        return np.asarray(self.reserved_rows, dtype=np.int64)

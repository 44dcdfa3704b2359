"""A CUDA run's allocator history (`python -m zsim.runtime --cuda-memory-history`, runtime/memory_history.py)
read back and replayed through zsim's model of the caching allocator (zsim.memory.allocator).

The replay feeds the runtime's own requests, in its order (`alloc` and `free_completed`, each with its
size and stream), to `CachingAllocator` and compares the reserved bytes it ends up holding with the
segments PyTorch reserved (`segment_alloc` / `segment_free`). Agreement says the allocator's rules are
right, so that a miss of the simulated peaks lies in the plan's requests (which tensors, sizes and
order), not in the allocator; `live_at_peak` itemises those requests by call site.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from zsim.memory.allocator import CachingAllocator
from zsim.trace.memory_history import FORMAT, read

__all__ = ["FORMAT", "Replay", "live_at_peak", "read", "replay"]

@dataclass(frozen=True)
class Replay:
    """Reserved bytes, measured and replayed, at the first step's start and their peaks from there on
    (as the runtime resets torch's peaks after setup); requests replayed; frees of blocks the history
    never saw allocated (made before recording began)."""

    reserved_at_start: int
    replayed_at_start: int
    reserved_peak: int
    replayed_peak: int
    requests: int
    unknown_frees: int

    @property
    def peak_error(self) -> float:
        """Replayed over measured reserved peak, minus one."""
        return self.replayed_peak / self.reserved_peak - 1.0


def replay(history: dict[str, Any]) -> Replay:
    """Replay `history` (see `read`) through zsim's CachingAllocator, without a capacity limit."""
    events = history["events"]
    marks = history.get("marks") or []
    start = next((m["event"] for m in marks if m.get("step") == 0 and m.get("event") is not None), 0)
    allocator = CachingAllocator(capacity=1 << 62)
    reserved = requests = unknown = 0
    at_start = replayed_at_start = peak = 0
    for i, (_, action, addr, size, stream, _) in enumerate(events):
        if i == start:
            at_start, replayed_at_start = reserved, allocator.reserved
            allocator.peak_reserved = allocator.reserved
            peak = reserved
        if action == "alloc":
            allocator.malloc(str(addr), size, str(stream))
            requests += 1
        elif action == "free_completed":
            if str(addr) in allocator._live:
                allocator.free(str(addr))
            else:
                unknown += 1
        elif action == "segment_alloc":
            reserved += size
        elif action == "segment_free":
            reserved -= size
        if i >= start:
            peak = max(peak, reserved)
    if start >= len(events):
        at_start, replayed_at_start = reserved, allocator.reserved
    return Replay(at_start, replayed_at_start, peak, allocator.peak_reserved, requests, unknown)


def live_at_peak(history: dict[str, Any], step: int = 1) -> tuple[int, dict[str, tuple[int, int]]]:
    """(allocated bytes, {call site: (bytes, blocks)}) at step `step`'s highest allocated moment, from
    the history's own blocks; a site '' is a request without Python frames (autograd's backward thread,
    cuBLAS's workspaces)."""
    events, sites, marks = history["events"], history["sites"], history.get("marks") or []
    bounds = [m["event"] for m in marks if m.get("event") is not None]
    steps = [m["step"] for m in marks if m.get("event") is not None]
    if step not in steps:
        raise ValueError(f"step {step}: the history marks steps {steps}")
    lo = bounds[steps.index(step)]
    hi = bounds[steps.index(step) + 1] if steps.index(step) + 1 < len(bounds) else len(events)
    live: dict[int, tuple[int, int]] = {}
    allocated, best, best_live = 0, -1, {}
    for i, (_, action, addr, size, _, site) in enumerate(events[:hi]):
        if action == "alloc":
            live[addr] = (size, site)
            allocated += size
        elif action == "free_completed" and addr in live:
            allocated -= live.pop(addr)[0]
        if i >= lo and allocated > best:
            best, best_live = allocated, dict(live)
    by_site: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for size, site in best_live.values():
        row = by_site[sites[site] if site >= 0 else ""]
        row[0] += size
        row[1] += 1
    return best, {k: (v[0], v[1]) for k, v in by_site.items()}

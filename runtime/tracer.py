"""Per-rank events in the zsim trace schema (docs/trace-schema.md), timed on a local clock.

Timestamps are microseconds since this rank's tracer started (`perf_counter_ns`), so they are
monotonic; `clock_offset_us` (measured by the worker after a barrier) puts them on rank 0's clock.
On CUDA, a phase's end synchronises the compute stream first, so that the span covers the kernels
and not only their launch. The file is rewritten after every step, so a rank that dies later
leaves the trace of the steps it finished.

Events on the `compute` track nest: a forward span holds Megatron's in-line MP all-reduces, a
checkpointed block's backward holds its recomputation, a `wait/...` event sits wherever the thread
waited. Each span records `nested_us`, the time of the events directly inside it, so its own
compute is `dur - nested_us` (what calibration fits).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from zsim.trace.schema import complete, counter, document, process_meta


class Tracer:
    """Collects one rank's events; `step` and `micro_batch` are stamped on every event."""

    def __init__(self, rank: int, *, sync: Callable[[], None] | None = None,
                 cuda_memory: Callable[[], dict[str, int]] | None = None):
        self.rank = rank
        self.step = 0
        self.micro_batch = 0
        self.events: list[dict[str, Any]] = process_meta(rank, f"rank {rank}")
        self._origin_ns = time.perf_counter_ns()
        self._sync = sync or (lambda: None)
        self._cuda_memory = cuda_memory
        self._closed_us = 0.0  # duration of the compute-track events closed at the current nesting level
        self._seqs: dict[tuple[int, ...], int] = {}

    def next_seq(self, group: tuple[int, ...]) -> int:
        """The index of the next collective on process group `group` (its members' global ranks)."""
        seq = self._seqs.get(group, 0)
        self._seqs[group] = seq + 1
        return seq

    def sync(self) -> None:
        """Wait for the device's compute stream (CUDA), so that a timestamp follows the work."""
        self._sync()

    def now_us(self) -> float:
        """Microseconds since this tracer started."""
        return (time.perf_counter_ns() - self._origin_ns) / 1000.0

    def complete(self, name: str, stream: str, start_us: float, end_us: float, **args: Any) -> None:
        """Record a finished event with nothing nested in it (a collective, a wait); `args` may
        carry the `step` and `micro_batch` it belongs to (a collective's are those it was issued in)."""
        stamp = {"step": self.step, "micro_batch": self.micro_batch, **args}
        self.events.append(complete(name, self.rank, stream, start_us, end_us - start_us, **stamp))
        if stream == "compute":
            self._closed_us += end_us - start_us

    def mark(self) -> tuple[float, float]:
        """The start of a compute span: (now, nesting bookkeeping) for `complete_span`."""
        return self.now_us(), self._closed_us

    def complete_span(self, name: str, mark: tuple[float, float], **args: Any) -> None:
        """Record a compute span started at `mark`, with `nested_us`: the events closed inside it."""
        start, closed = mark
        end = self.now_us()
        self.events.append(complete(name, self.rank, "compute", start, end - start, step=self.step,
                                    micro_batch=self.micro_batch, nested_us=self._closed_us - closed, **args))
        self._closed_us = closed + (end - start)

    @contextmanager
    def span(self, name: str, **args: Any) -> Iterator[None]:
        """Time the body as one compute span (synchronising the device at the end)."""
        mark = self.mark()
        yield
        self.sync()
        self.complete_span(name, mark, **args)

    def memory(self, values: dict[str, int]) -> None:
        """A `memory` counter (bytes by category); on CUDA also `cuda_memory`."""
        ts = self.now_us()
        self.events.append(counter("memory", self.rank, ts, values))
        if self._cuda_memory is not None:
            self.events.append(counter("cuda_memory", self.rank, ts, self._cuda_memory()))

    def write(self, path: Path, metadata: dict[str, Any]) -> None:
        """Write the trace file atomically (a reader never sees half a file)."""
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(document(self.events, metadata)))
        os.replace(tmp, path)

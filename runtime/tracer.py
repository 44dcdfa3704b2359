"""Per-rank events in the zsim trace schema (docs/trace-schema.md), timed on a local clock.

Timestamps are microseconds since this rank's tracer started (`perf_counter_ns`), so they are
monotonic; `clock_offset_us` (measured by the worker after a barrier) puts them on rank 0's clock.
Spans are stamped by the rank's clock (runtime/clock.py): the host's on CPU; CUDA events on the
stream the work runs on on a GPU, resolved after the step (`flush`), so that nothing inside the
measured step synchronises the device. A device-timed span also records `host_us`, the host time
between its two stamps (the launch cost, recorded apart). The file is rewritten after every step,
so a rank that dies later leaves the trace of the steps it finished.

Events on the `compute` track nest: a forward span holds Megatron's in-line MP all-reduces, a
checkpointed block's backward holds its recomputation, a `wait/...` event sits wherever the
thread (or, on a GPU, the compute stream) waited. Each span records `nested_us`, the time of the
events directly inside it, so its own compute is `dur - nested_us` (what calibration fits).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .clock import CudaEventClock, HostClock
from zsim.trace.schema import complete, counter, document, process_meta


@dataclass
class Mark:
    """The start of a compute span: its stamp, the host time, and where its children begin."""

    stamp: Any
    host_us: float
    level: int
    label: AbstractContextManager | None = None


@dataclass(eq=False)
class _Open:
    """An event whose times are stamps until `Tracer.flush` resolves them."""

    name: str
    stream: str
    start: Any
    end: Any
    args: dict[str, Any]
    children: list[_Open] | None = None  # a span's directly nested compute events
    host_us: float | None = None  # device-timed spans: host time between the two stamps
    dur: float = field(default=0.0)


class Tracer:
    """Collects one rank's events; `step` and `micro_batch` are stamped on every event.

    `clock`: how spans are stamped (default: the host clock); `label`: a context-manager factory
    wrapped around every span (torch.profiler.record_function under --torch-profiler, so that the
    profiler's kernels fall under zsim's op names)."""

    def __init__(self, rank: int, *, clock: Callable[[Callable[[], float]], HostClock | CudaEventClock] | None = None,
                 cuda_memory: Callable[[], dict[str, int]] | None = None,
                 label: Callable[[str], AbstractContextManager] | None = None):
        self.rank = rank
        self.step = 0
        self.micro_batch = 0
        self.events: list[dict[str, Any]] = process_meta(rank, f"rank {rank}")
        self._origin_ns = time.perf_counter_ns()
        self.clock = clock(self.now_us) if clock is not None else HostClock(self.now_us)
        self._cuda_memory = cuda_memory
        self._label = label
        self._pending: list[_Open] = []  # events awaiting `flush`, in the order they closed
        self._level: list[_Open] = []  # compute events closed at the current nesting level
        self._open_spans = 0
        self._seqs: dict[tuple[int, ...], int] = {}
        self.clock.anchor()

    @property
    def device_timed(self) -> bool:
        return self.clock.device_timed

    def next_seq(self, group: tuple[int, ...]) -> int:
        """The index of the next collective on process group `group` (its members' global ranks)."""
        seq = self._seqs.get(group, 0)
        self._seqs[group] = seq + 1
        return seq

    def now_us(self) -> float:
        """Microseconds since this tracer started (host clock)."""
        return (time.perf_counter_ns() - self._origin_ns) / 1000.0

    def stamp(self) -> Any:
        """A timestamp on this rank's clock: host µs, or a CUDA event on the current stream."""
        return self.clock.stamp()

    def begin_step(self, step: int) -> None:
        """Between steps: resolve what is pending and re-anchor the device clock (a synchronize,
        outside any measured step)."""
        self.flush()
        self.step = step
        self.clock.anchor()

    def complete(self, name: str, stream: str, start: Any, end: Any, **args: Any) -> None:
        """Record a finished event with nothing nested in it (a collective, a wait) between two
        stamps; `args` may carry the `step` and `micro_batch` it belongs to (a collective's are those
        it was issued in)."""
        rec = _Open(name, stream, start, end, {"step": self.step, "micro_batch": self.micro_batch, **args})
        self._pending.append(rec)
        if stream == "compute":
            self._level.append(rec)
        if not self.device_timed:  # host stamps are final: keep the events in closing order with the counters
            self.flush()

    def mark(self, name: str | None = None) -> Mark:
        """The start of a compute span, for `complete_span`; `name` opens its profiler label."""
        label = None
        if self._label is not None and name is not None:
            label = self._label(name)
            label.__enter__()
        self._open_spans += 1
        return Mark(self.clock.stamp(), self.now_us(), len(self._level), label)

    def complete_span(self, name: str, mark: Mark, **args: Any) -> None:
        """Record a compute span started at `mark`, with `nested_us`: the events closed inside it."""
        end = self.clock.stamp()
        host_end = self.now_us()
        if mark.label is not None:
            mark.label.__exit__(None, None, None)
        children = self._level[mark.level:]
        del self._level[mark.level:]
        rec = _Open(name, "compute", mark.stamp, end,
                    {"step": self.step, "micro_batch": self.micro_batch, **args}, children=children,
                    host_us=host_end - mark.host_us if self.device_timed else None)
        self._pending.append(rec)
        self._level.append(rec)
        self._open_spans -= 1
        if not self.device_timed:
            self.flush()

    @contextmanager
    def span(self, name: str, **args: Any) -> Iterator[None]:
        """Time the body as one compute span."""
        mark = self.mark(name)
        yield
        self.complete_span(name, mark, **args)

    def label(self, name: str) -> AbstractContextManager:
        """The profiler label alone (for work that is not a span of its own)."""
        return self._label(name) if self._label is not None else nullcontext()

    def flush(self) -> None:
        """Resolve the pending events into trace events (on CUDA: one synchronize, then each event's
        time from its stamps)."""
        if not self._pending:
            return
        self.clock.settle()
        resolve = self.clock.resolve
        for rec in self._pending:  # closing order: a span's children are resolved before it
            start = resolve(rec.start)
            rec.dur = max(0.0, resolve(rec.end) - start)
            args = rec.args
            if rec.children is not None:
                args["nested_us"] = sum(c.dur for c in rec.children)
            if rec.host_us is not None:
                args["host_us"] = rec.host_us
            if self.device_timed:
                args["timing"] = self.clock.name
            self.events.append(complete(rec.name, self.rank, rec.stream, start, rec.dur, **args))
        self._pending.clear()
        if self._open_spans == 0:
            self._level.clear()

    def memory(self, values: dict[str, int]) -> None:
        """A `memory` counter (bytes by category, host time); on CUDA also `cuda_memory`."""
        ts = self.now_us()
        self.events.append(counter("memory", self.rank, ts, values))
        if self._cuda_memory is not None:
            self.events.append(counter("cuda_memory", self.rank, ts, self._cuda_memory()))

    def write(self, path: Path, metadata: dict[str, Any]) -> None:
        """Resolve what is pending and write the trace file atomically (a reader never sees half a file),
        each stream's partially overlapping spans on lanes of it (zsim.runtime.merge.lane_rank_file), so
        that a rank that dies before the merge leaves a file viewers accept too."""
        from .merge import lane_rank_file

        self.flush()
        doc = document(self.events, metadata)
        lane_rank_file(doc, self.rank)  # copies the spans it moves: self.events keeps the stream tids
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, path)

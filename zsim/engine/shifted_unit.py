"""Gradient accumulation from ONE simulated micro-batch: the later ones are the first, shifted in time,
with their memory replayed (zsim.engine.repeat tries this before it simulates two or more).

Where the second micro-batch of a step's first two is the first copied (zsim.zero.pass_copy: the same
ops, names, streams, costs, collectives and bytes, its dependencies the first's moved, its memory effects
the first's less the step's tensors, which only the first allocates), it is not planned at all: the plan
is the first micro-batch's ops and the optimizer step's, whose dependencies on the second are on the
first's counterparts (zsim.zero.plan.build_unit_plan), and the second is known by the copy rule
(zsim.zero.pass_copy.Second). The engine simulates that plan and proves from the run:

  - a clean boundary: exactly one op of the first micro-batch ends last, at T0, and every stream's first
    op of the second becomes ready at T0 exactly (its stream predecessor or a dependency in the first
    ends then), so the second starts at T0 from an idle state (nothing in flight on a stream or link), as
    the first started at 0. Op durations depend on nothing else on a GPU in class mode (compute prices
    its kernels, a collective its phases on the fabric its own ops share, a host copy its bytes; memory
    never feeds back into timing: the ledger's calls do not yield), so the second runs as the first,
    P = T0 later, and by induction so does every later one;
  - the optimizer step's first op on each stream becomes ready when the last micro-batch ends (its
    dependencies on that micro-batch, moved to the first, end at T0 exactly), so it runs as in the
    reduced run, (G − 1)·P later;
  - memory: the ledger's calls of the second micro-batch are made (the replay) on the ledger as the
    first leaves it, before the optimizer's first call, at the first's times + P, in the order the first
    made its own, under the first's tags (a tag is a name, never a size or a place: the allocator keys
    its blocks by it and nothing else), which none of the first's tensors still holds (else unproven).
    That order is the full simulation's wherever it is forced: within one instant, two calls that do not
    commute (not both frees) come from one op (allocation before free), or from an op and one that it
    released at that instant (its dependency or stream predecessor that ended last, in a chain), or
    from the op its stream's worker ran on to at once and one the same op released through its event;
    anything else (two ops released independently at one instant, e.g. both at the start)
    leaves the proof unproven. The ledger's state (allocator, live tensors, arenas, totals; tags without
    their micro-batch) after the replay must equal the state before it: from equal states the same
    requests make the same decisions, so every later micro-batch holds the same memory, and the
    optimizer step meets the state it would meet after the last.

The Result of 2 micro-batches follows (the second's trace events are the first's, one period later); then
zsim.engine.repeat splices the second as the unit G − 2 more times. Any unproven condition: None, and the
caller goes on to repeat's simulation of 2 or more micro-batches.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from zsim.memory.ledger import MemoryLedger
from zsim.trace import schema
from zsim.zero.ops import Plan
from zsim.zero.pass_copy import Second

if TYPE_CHECKING:
    from zsim.engine.result import Result

class Unproven(Exception):
    """The reduced run cannot prove the shift (raised inside it to stop it early)."""


@dataclass(slots=True)
class Probe:
    """What the reduced run's ledgers report: each op's memory calls in order (op index in the reduced
    plan, 'a' or 'f'), and at the optimizer step's first call the replay of the second micro-batch."""

    run: Any
    plan: Plan  # the first micro-batch's ops and the optimizer step's (zsim.zero.plan.build_unit_plan)
    second: Second
    n0: int
    by_id: dict[int, int]  # id of an op's allocs or frees tuple (what the engine passes) -> reduced-plan index
    calls: list[tuple[int, str]] = field(default_factory=list)
    replayed: bool = False
    marks: dict[str, Any] = field(default_factory=dict)  # where the replay begins and ends in the outputs
    by_tag: dict[tuple[str, str], list[int]] | None = None  # for calls split between GPU and host
    done: dict[str, bytearray] = field(default_factory=dict)
    persistent: frozenset[str] = frozenset()

    def before(self, kind: str, given: tuple) -> None:
        i = self.by_id.get(id(given), -1)
        if i < 0:
            tag = given[0].tag if kind == "a" else given[0]
            if kind == "a" and tag in self.persistent:
                return  # the model states, allocated before the streams start
            i = self._by_tag(kind, tag)
            if i < 0:
                raise Unproven(f"a memory call of no op of the plan ({kind} {tag})")
        if i >= self.n0 and not self.replayed:
            self.replay()
        if not self.calls or self.calls[-1] != (i, kind):  # a call split between GPU and host is one
            self.calls.append((i, kind))
            self.done[kind][i] = 1

    def _by_tag(self, kind: str, tag: str) -> int:
        """The op of a call whose tuple is not an op's own (the engine split it between GPU and host): of
        those that allocate (free) `tag`, the one making its call now, or the first yet to make it."""
        if self.by_tag is None:
            self.by_tag = {}
            for k, op in enumerate(self.run.plan.ops):
                for key in [("a", a.tag) for a in op.allocs] + [("f", tag) for tag in op.frees]:
                    self.by_tag.setdefault(key, []).append(k)
        candidates = self.by_tag.get((kind, tag), [])
        if self.calls and self.calls[-1][1] == kind and self.calls[-1][0] in candidates:
            return self.calls[-1][0]
        return next((k for k in candidates if not self.done[kind][k]), -1)

    def replay(self) -> None:
        run, n0, second = self.run, self.n0, self.second
        if not all(run.done[i].triggered for i in range(n0)):
            raise Unproven("the optimizer step touched memory before the first micro-batch ended")
        gpu, host = run.ledger, run.host_ledger
        t0 = max(run.end_time[:n0])
        suffix = second.suffix
        # The replay's tags are the first's: none may still be held. Then none collides, as none did when
        # the first made the same calls from a state holding none of them.
        held = [tag for ledger in (gpu, host) for tag in ledger.live if tag.endswith(suffix)]
        if held:
            raise Unproven(f"a tensor of the first micro-batch outlives it ({held[0]})")
        self.marks.update(state=(_memory_state(gpu), _memory_state(host)), events=len(run.events))
        self.replayed = True
        ops, start, end, trace = self.plan.ops, run.start_time, run.end_time, run.trace
        for i, kind in list(self.calls):
            op = ops[i]
            if kind == "a":
                allocs = second.allocs(op, suffix)
                if not allocs:
                    continue  # what only the first micro-batch does (e.g. its gradient partition at stage 3)
                now = t0 + start[i]
                if any(a.where == "host" for a in allocs):  # as zsim.engine.workers.stream_worker
                    for on_host in (False, True):
                        requests = [a for a in allocs if (a.where == "host") == on_host]
                        if requests:
                            MemoryLedger.alloc_many(host if on_host else gpu, now, requests, op.stream)
                else:
                    MemoryLedger.alloc_many(gpu, now, allocs, op.stream)
            else:
                now = t0 + end[i]
                live = gpu.live
                if all(tag in live for tag in op.frees):
                    MemoryLedger.free_many(gpu, now, op.frees)
                else:
                    for on_gpu in (True, False):
                        tags = [tag for tag in op.frees if (tag in live) == on_gpu]
                        if tags:
                            MemoryLedger.free_many(gpu if on_gpu else host, now, tags)
            if trace:
                run.events.append(schema.counter("memory", run.pids[0], now * 1e6, gpu.counters()))
        self.marks.update(after=(_memory_state(gpu), _memory_state(host)), events_end=len(run.events),
                          rows=(len(gpu.times), len(host.times)), flushes=(len(gpu.flush_times), len(host.flush_times)),
                          peaks=[(ledger.peak, ledger.peak_reserved) for ledger in (gpu, host)])


def _memory_state(ledger: MemoryLedger) -> tuple:
    from zsim.engine.repeat import memory_state as state  # one definition of a ledger's state

    return state(ledger)


@dataclass(slots=True)
class ProbedLedger(MemoryLedger):
    """A MemoryLedger that tells its Probe of every call before making it."""

    probe: Probe | None = None

    def alloc_many(self, time: float, requests, stream: str = "compute") -> None:
        requests = tuple(requests)
        if requests and self.probe is not None:
            self.probe.before("a", requests)
        MemoryLedger.alloc_many(self, time, requests, stream)

    def free_many(self, time: float, tags) -> None:
        tags = tuple(tags)
        if tags and self.probe is not None:
            self.probe.before("f", tags)
        MemoryLedger.free_many(self, time, tags)


def probe_for(plan: Plan, second: Second) -> Probe:
    """A Probe for the run of `plan` (zsim.zero.plan.build_unit_plan's, with `second`); attach() it to the run."""
    by_id: dict[int, int] = {}
    shared: set[int] = set()
    for k, op in enumerate(plan.ops):
        for given in (op.allocs, op.frees):
            if given:
                if id(given) in by_id:
                    shared.add(id(given))  # one tuple for several ops: found by tag instead
                by_id[id(given)] = k
    for key in shared:
        del by_id[key]
    size = len(plan.ops)
    return Probe(None, plan, second, second.first.end - second.first.start, by_id,
                 done={"a": bytearray(size), "f": bytearray(size)}, persistent=frozenset(a.tag for a in plan.persistent))


def attach(probe: Probe, run: Any) -> None:
    """The observer of the reduced run (zsim.engine.simulation.simulate's `observe`)."""
    probe.run = run
    run.ledger = ProbedLedger(capacity=run.ledger.capacity, probe=probe)
    run.ledgers[0] = run.ledger
    run.host_ledger = ProbedLedger(capacity=None, probe=probe)


def proven(probe: Probe, reduced: Result) -> float | None:
    """T0, the first micro-batch's end (s), when the reduced run proves the shift (module docstring)."""
    run, n0 = probe.run, probe.n0
    if not probe.replayed or reduced.ledger.oom is not None or probe.marks["state"] != probe.marks["after"]:
        return None
    end, start, sub = run.end_time, run.start_time, run.plan.ops
    t0 = max(end[:n0])
    if end[:n0].count(t0) != 1:
        return None
    pred = [-1] * len(sub)  # each reduced-plan op's stream predecessor
    for indices in run.by_stream:
        for a, b in zip(indices, indices[1:]):
            pred[b] = a
    second = probe.second
    for indices in run.by_stream:
        mb0 = [i for i in indices if i < n0]
        rest = [i for i in indices if i >= n0]
        # The first op on this stream of the second micro-batch, and of the optimizer step: ready at T0
        # (through what it waits for in the first, or stands for the second), unless it waits for an op
        # of its own part, which starts at T0 or later (then T0 at most will do: it is). The optimizer
        # step's dependencies below n0 are on the second's ops, planned as their counterparts in the first.
        if mb0:
            waits = second.deps(sub[mb0[0]], mb0[0])  # in the plan of both micro-batches
            if not any(n0 <= d for d in waits) and max([end[mb0[-1]]] + [end[d] for d in waits]) != t0:
                return None
        if rest:
            k = rest[0]
            waits = sub[k].deps
            if not any(n0 <= d for d in waits):
                if max([end[d] for d in waits] + ([end[pred[k]]] if pred[k] >= 0 else []), default=-1.0) != t0:
                    return None
    if not _forced(probe.calls, sub, pred, start, end):
        return None
    return t0


def _forced(calls: list[tuple[int, str]], ops, pred: list[int], start: list[float], end: list[float]) -> bool:
    """Whether every two calls of one instant that do not commute are in an order the engine forces
    (module docstring)."""
    def when(call: tuple[int, str]) -> float:
        return start[call[0]] if call[1] == "a" else end[call[0]]

    @functools.cache  # asked again for each pair of one instant's calls and along each chain
    def cause(i: int) -> int:
        at = start[i]
        found = {x for x in ((pred[i],) if pred[i] >= 0 else ()) + ops[i].deps if end[x] == at}
        return found.pop() if len(found) == 1 else -1

    def sync(i: int) -> bool:  # its stream's worker ran on to it at once, no dependency pending
        return pred[i] >= 0 and cause(i) == pred[i] and all(end[d] < start[i] for d in ops[i].deps)

    def ancestor(x: int, y: int) -> bool:
        at = start[y]
        y = cause(y)
        while y >= 0:
            if y == x:
                return True
            if start[y] != at:
                return False
            y = cause(y)
        return False

    k, n = 0, len(calls)
    while k < n:
        t = when(calls[k])
        m = k + 1
        while m < n and when(calls[m]) == t:
            m += 1
        group = calls[k:m]
        for p, (x, kx) in enumerate(group):
            for y, ky in group[p + 1:]:
                if x == y or (kx == "f" and ky == "f") or ancestor(x, y):
                    continue
                if kx == "a" and sync(x) and not sync(y) and cause(x) >= 0 and cause(x) == cause(y):
                    continue
                return False
        k = m
    return True


def two_micro_batches(probe: Probe, reduced: Result, t0: float) -> tuple[Result, Any]:
    """The Result of the plan of 2 micro-batches from the reduced run: its totals with the first's again,
    the second's memory from the replay, its trace events one period P = T0 later (the optimizer's too)."""
    from zsim.engine.repeat import added_by, moved_event  # the totals an op set adds, an event moved by copies

    run, n0, marks = probe.run, probe.n0, probe.marks
    added = added_by(run, list(range(n0)), run.start_time)
    totals = [a + d for a, d in zip((reduced.compute_seconds, reduced.hardware_flops, reduced.mp_comm_seconds,
                                     reduced.ep_comm_seconds, reduced.offload_seconds), added.totals)]
    comm = {}
    for key, stats in reduced.comm.items():
        d = added.comm.get(key, (0, 0, 0.0, 0.0))
        comm[key] = dataclasses.replace(stats, count=stats.count + d[0], payload_bytes=stats.payload_bytes + d[1],
                                        sent_bytes=stats.sent_bytes + d[2], seconds=stats.seconds + d[3])
    ledgers = [_shifted(ledger, rows, flushes, peaks, t0)
               for ledger, rows, flushes, peaks in zip((reduced.ledger, reduced.host_ledger), marks["rows"],
                                                       marks["flushes"], marks["peaks"])]
    events = reduced.events
    if events:  # before the replay: the first's and early optimizer events; the replay's; the optimizer's
        p_us, a, z = t0 * 1e6, marks["events"], marks["events_end"]
        optimizer = [e for e in events[:a] if e["ph"] == "X" and e["args"]["micro_batch"] == 1] + events[z:]
        first = [e for e in events[:a] if e["ph"] != "X" or e["args"]["micro_batch"] == 0]
        events = (first + [moved_event(e, 1, p_us) for e in first if e["ph"] == "X"] + events[a:z]
                  + [dict(e, ts=e["ts"] + p_us) for e in optimizer])
    return dataclasses.replace(
        reduced, step_seconds=[reduced.step_seconds[0] + t0], compute_seconds=totals[0], hardware_flops=totals[1],
        mp_comm_seconds=totals[2], ep_comm_seconds=totals[3], offload_seconds=totals[4], comm=comm,
        ledger=ledgers[0], host_ledger=ledgers[1], events=events), added


def _shifted(ledger: MemoryLedger, rows: int, flushes: int, peaks: tuple[int, int], p: float) -> MemoryLedger:
    """`ledger` with what the optimizer step recorded after the replay moved `p` s later: its timeline
    from row `rows`, its flushes from `flushes`, a peak above `peaks` (the peaks after the replay). Its
    first row replaces the replay's last where both fall on one instant (one state per instant)."""
    times = ledger.times[:rows] + [t + p for t in ledger.times[rows:]]
    rows_, reserved = list(ledger.rows), list(ledger.reserved_rows)
    if 0 < rows < len(times) and times[rows] == times[rows - 1]:
        del times[rows - 1], rows_[rows - 1], reserved[rows - 1]
    fields = {f.name: getattr(ledger, f.name) for f in dataclasses.fields(MemoryLedger)}
    fields.update(times=times, rows=rows_, reserved_rows=reserved,
                  flush_times=ledger.flush_times[:flushes] + [t + p for t in ledger.flush_times[flushes:]],
                  peak_time=ledger.peak_time + (p if ledger.peak > peaks[0] else 0.0),
                  peak_reserved_time=ledger.peak_reserved_time + (p if ledger.peak_reserved > peaks[1] else 0.0))
    return MemoryLedger(**fields)


def simulate_one(scenario: Any, simulate_reduced: Any, unit_of: Any) -> tuple[Result, float, Any] | None:
    """(the Result of 2 micro-batches, T0 s, what one micro-batch adds: zsim.engine.repeat.Added) from a
    run of one (module docstring), or None where unproven. `unit_of(scenario)`: its workload and
    zsim.zero.plan.build_unit_plan's (plan, Second), the latter None where the second micro-batch is not
    the first copied; `simulate_reduced(scenario, observe, planned)`: a class-mode run of `scenario` with
    `planned` as its (workload, plan)."""
    two = dataclasses.replace(scenario, grad_accum=2)
    workload, unit = unit_of(two)
    if unit is None:
        return None
    plan, second = unit
    probe = probe_for(plan, second)
    try:
        reduced = simulate_reduced(two, lambda run: attach(probe, run), (workload, plan))
    except Unproven:
        return None
    t0 = proven(probe, reduced)
    if t0 is None:
        return None
    result, added = two_micro_batches(probe, reduced, t0)
    return result, t0, added

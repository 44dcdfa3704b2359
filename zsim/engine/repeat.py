"""Gradient accumulation without simulating every micro-batch: find the repeating one, splice copies.

A step of G micro-batches is, on a symmetric run, a first micro-batch (its allocator starts cold), G − 2
that repeat, and a last one (stages 0/1 reduce only there) followed by the optimizer step. The engine is
deterministic, so a micro-batch repeats exactly when it starts from the same state: nothing of the earlier
ones still in flight on any stream or link (a *clean* boundary), and the same memory state (caching
allocator, live tensors, arenas). `extrapolate` simulates the step with n < G micro-batches, proves that
one of them, the unit, repeats, and builds the G-micro-batch Result with G − n more copies of the unit:

  first, one micro-batch simulated (zsim.engine.shifted_unit: where the second is the first copied
        (zsim.zero.pass_copy), as at stages 2-3 that reduce every micro-batch, it is neither planned nor
        simulated: it is proven to be the first shifted from the first's run, and its memory is replayed
        on the ledger: a Result of n = 2 whose second, the unit, was not simulated);
  else n = 2 (the unit is the last micro-batch, where its ops are those of the others), then n = 3, 5, 7
        (the unit is the one before the last; more while the allocator still reserves new segments in it).
  - clean boundaries: every op of micro-batch k ends before any op of k + 1 starts, and every op of the
    unit before any op after it;
  - periodic timing: every op of the unit starts and ends one period P after its counterpart in the
    micro-batch before it (ops matched by position, name and stream), and what follows the unit starts
    P after it (to PERIOD_TOL); so do the totals the unit adds (compute, FLOPs, each kind of collective:
    count and bytes exactly, sent bytes and seconds to PERIOD_TOL);
  - periodic memory: the ledger's state (zsim.memory.allocator.CachingAllocator.state, live tensors,
    arenas, totals; tags without their micro-batch) as the unit makes its first allocation equals the
    state as what follows it makes its first (the next micro-batch; at n = 2 the optimizer), with no
    memory effect of the unit or of what follows before either: from equal states the same requests
    make the same decisions, so every copy of the unit holds the same memory.

When a check fails (e.g. stage 2's reduce-scatters fall further behind the compute stream every
micro-batch, so no boundary is clean), or the run is one the proof does not cover (per-rank mode, a CPU
host, replayed durations, several steps, pipeline stages), the caller simulates every micro-batch.

The extrapolated Result is the full simulation's: counts, bytes, memory peaks, the memory timeline's
values and the allocator's states exactly; times (step, per-kind seconds, trace timestamps) to float
round-off, since the full simulation reaches t + k·P by k additions of durations where the splice adds
k·P once (tests/test_repeat.py).
"""

from __future__ import annotations

import bisect
import dataclasses
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from zsim.engine import shifted_unit
from zsim.engine.offload import transfer_seconds
from zsim.engine.result import CommStats, Result
from zsim.memory.ledger import MemoryLedger
from zsim.zero.ops import EP_GROUPS

if TYPE_CHECKING:
    from zsim.scenario.scenario import Scenario

# Micro-batches simulated, in turn until the proof holds (module docstring): 2 where the last one is a
# unit, else 3 and, while the allocator still reserves new segments in the unit, 5 and 7.
REDUCED = (2, 3, 5, 7)
# Two times that should be one period apart may differ by round-off of absolute times (float64 keeps
# ~16 digits of a time of up to ~1e4 s): 1e-9 of the period is far above that and far below any real
# difference of a schedule (the fabric's own end-of-transfer tolerance is 1e-9 of a transfer, sharing.py).
PERIOD_TOL = 1e-9
_MB = re.compile(r"\.m(\d+)(?=\.|$)")  # a plan tag's micro-batch ('act.layer.3.s0.m2' -> 2)
# The optimizer step's tags (zsim.zero.optimizer_step: 'optimizer.grads_copy.s0', its first allocation)
_OPTIMIZER = "optimizer."
OPT = -1  # the snapshot key of the optimizer step's first allocation


def _mb_free(tag: str) -> str:
    return _MB.sub("", tag)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The ledgers as a micro-batch (or the optimizer step) makes its first allocation: when (s), and
    their state (tags without their micro-batch)."""

    time: float
    memory: tuple


def memory_state(ledger: MemoryLedger) -> tuple:
    allocator = ledger.allocator
    live = sorted((_mb_free(tag), entry) for tag, entry in ledger.live.items())
    return (allocator.state(_mb_free) if allocator is not None else None, tuple(live),
            tuple(sorted((name, a.size, a.used) for name, a in ledger.arenas.items())), tuple(ledger.totals.items()))


@dataclass(slots=True)
class WatchedLedger(MemoryLedger):
    """A MemoryLedger that calls `watch(time, key)` before the first allocation tagged with each new
    micro-batch (key: its number) and before the optimizer step's first (key OPT)."""

    watch: Callable[[float, int], None] | None = None
    seen: int = -1
    optimizer_seen: bool = False
    _next: str = ".m0"  # the tag suffix of the next micro-batch (zsim.zero.step_pass's tags end with it)

    def alloc_many(self, time: float, requests, stream: str = "compute") -> None:
        if self.watch is not None:
            requests = tuple(requests)
            for r in requests:
                tag = r.tag
                if self._next in tag:  # a cheap test first: the hot path of the reduced run
                    found = _MB.search(tag)
                    if found is not None and int(found.group(1)) > self.seen:
                        self.seen = int(found.group(1))
                        self._next = f".m{self.seen + 1}"
                        self.watch(time, self.seen)
                        break
                if not self.optimizer_seen and tag.startswith(_OPTIMIZER):
                    self.optimizer_seen = True
                    self.watch(time, OPT)
                    break
        MemoryLedger.alloc_many(self, time, requests, stream)


class Watch:
    """The observer of the reduced simulation (zsim.engine.simulation.simulate's `observe`): keeps the
    run and swaps its GPU ledger for a WatchedLedger whose snapshots it keeps."""

    def __init__(self) -> None:
        self.run: Any = None
        self.snapshots: dict[int, Snapshot] = {}
        self.unsettled = False  # set by _prove: more micro-batches may prove what these did not

    def __call__(self, run: Any) -> None:
        self.run = run
        run.ledger = WatchedLedger(capacity=run.ledger.capacity, watch=self.snapshot)
        run.ledgers[0] = run.ledger  # the engine allocates through its per-stage list (one stage here)

    def snapshot(self, now: float, key: int) -> None:
        self.snapshots[key] = Snapshot(now, (memory_state(self.run.ledger), memory_state(self.run.host_ledger)))


def applies(scenario: Scenario, per_rank: bool, overridden: bool) -> bool:
    """Whether the proof can cover this run: class mode on GPUs, one step, more micro-batches than the
    smallest reduced run, no replayed durations, no pipeline stages, no merged passes (parallel.ep_overlap: each
    micro-batch's forward runs with the previous one's backward, so no micro-batch's ops stand alone), no SM
    contention (fabric.sm_contention: a compute op's time is not its time alone, which the proof's totals add)."""
    pp = getattr(scenario.parallel, "pp", 1) or 1
    if getattr(scenario.parallel, "ep_overlap", False) or getattr(scenario.fabric, "sm_contention", False):
        return False
    return (not per_rank and not overridden and scenario.cluster.host is None and scenario.run.steps == 1
            and scenario.grad_accum > REDUCED[0] and pp == 1)


def extrapolate(scenario: Scenario, simulate_reduced: Callable[..., Result],
                unit_of: Callable[[Scenario], tuple] | None = None) -> Result | None:
    """The Result of `scenario` (grad_accum G) from a simulation of one micro-batch where the later ones
    are proven to be it shifted (zsim.engine.shifted_unit; `unit_of(scenario)` gives its workload and
    zsim.zero.plan.build_unit_plan's answer), else of n < G, n from REDUCED in turn while a larger one may prove what a smaller did not
    (`simulate_reduced(reduced scenario, observer[, (workload, plan) to run])`), or None when no
    micro-batch is proven to repeat (module docstring); the caller then simulates all G."""
    wall = time.perf_counter()
    one = shifted_unit.simulate_one(scenario, simulate_reduced, unit_of) if unit_of is not None else None
    if one is not None:  # a Result of 2 micro-batches whose second (the unit) was not simulated
        reduced, t0, added = one
        n, simulated, proof = 2, 1, (1, t0, t0 + t0, added)
    else:
        for n in REDUCED:
            if n >= scenario.grad_accum:
                return None
            watch = Watch()
            reduced = simulate_reduced(dataclasses.replace(scenario, grad_accum=n), watch)
            proof = _prove(watch, reduced)
            if proof is not None:
                break
            if not watch.unsettled:
                return None  # more micro-batches would not help
        else:
            return None
        simulated = n
    unit, first_start, unit_end, added = proof
    extra = scenario.grad_accum - n
    period = unit_end - first_start  # the unit's window is [first_start, unit_end): both times of the clock
    totals = [a + extra * d for a, d in zip(_totals(reduced), added.totals)]
    comm = {}
    for key, stats in reduced.comm.items():
        d = added.comm.get(key, (0, 0, 0.0, 0.0))
        comm[key] = CommStats(stats.count + extra * d[0], stats.payload_bytes + extra * d[1],
                              stats.sent_bytes + extra * d[2], stats.seconds + extra * d[3])
    workload = reduced.workload
    return dataclasses.replace(
        reduced,
        scenario=scenario,
        # rank_model_states reads the zero, layout and precision sections and the workload, which the
        # reduced scenario shares (it differs in grad_accum only): its model states are these
        model_states=reduced.model_states,
        step_seconds=[reduced.step_seconds[0] + extra * period],
        compute_seconds=totals[0], hardware_flops=totals[1], mp_comm_seconds=totals[2], ep_comm_seconds=totals[3],
        offload_seconds=totals[4],
        model_flops=scenario.grad_accum * sum(3 * m.fwd_flops for m in workload.modules),  # as simulate()
        comm=comm,
        ledger=splice_ledger(reduced.ledger, first_start, unit_end, extra),
        host_ledger=splice_ledger(reduced.host_ledger, first_start, unit_end, extra),
        events=splice_events(reduced.events, unit, first_start, unit_end, extra),
        wall_seconds=time.perf_counter() - wall,
        repeated_micro_batches=scenario.grad_accum - simulated,
    )


def _totals(result: Result) -> tuple[float, ...]:
    return (result.compute_seconds, result.hardware_flops, result.mp_comm_seconds, result.ep_comm_seconds,
            result.offload_seconds)


@dataclass(slots=True)
class Added:
    """What a set of ops adds to a Result's totals (as zsim.engine.workers.stream_worker adds them
    in class mode on a GPU): (compute s, FLOPs, MP s, EP s, offload s) and per (group, collective):
    (count, payload bytes, sent bytes, seconds)."""

    totals: tuple[float, ...]
    comm: dict[tuple[str, str], tuple[int, int, float, float]]

    def matches(self, other: Added) -> bool:
        """Counts and bytes equal, the rest to PERIOD_TOL."""
        if self.comm.keys() != other.comm.keys() or not all(map(_close, self.totals, other.totals)):
            return False
        return all(a[:2] == b[:2] and _close(a[2], b[2]) and _close(a[3], b[3])
                   for a, b in ((self.comm[k], other.comm[k]) for k in self.comm))


def added_by(run: Any, indices: list[int], start: list[float]) -> Added:
    compute = flops = mp = ep = offload = 0.0
    comm: dict[tuple[str, str], tuple[int, int, float, float]] = {}
    ops, end, phases, compute_time = run.plan.ops, run.end_time, run.phases, run.compute_time  # the loop's names
    for i in indices:
        op = ops[i]
        if op.collective:
            seconds = end[i] - start[i]
            key = (op.group, op.collective)
            count, payload, sent, total = comm.get(key, (0, 0, 0.0, 0.0))
            comm[key] = (count + 1, payload + op.nbytes, sent + phases(op)[2], total + seconds)
            mp += seconds if op.group == "mp" and op.stream == "compute" else 0.0  # in line, as stream_worker
            ep += seconds if op.group in EP_GROUPS else 0.0
        elif op.transfer:
            offload += transfer_seconds(op.nbytes, run.s.cluster.offload)
        elif op.stream != "host":  # as stream_worker: the 'host' lane is no compute-stream time
            compute += compute_time(op, i)
            flops += op.flops
    return Added((compute, flops, mp, ep, offload), comm)


def _prove(watch: Watch, reduced: Result) -> tuple[int, float, float, Added] | None:
    """(the unit micro-batch, its start s, the start s of what follows it, what it adds to the totals)
    when the unit is proven to repeat (module docstring), else None, with `watch.unsettled` set where a
    run of more micro-batches may prove it."""
    run, snaps = watch.run, watch.snapshots
    ops = run.plan.ops
    n = run.s.grad_accum
    if reduced.ledger.oom is not None or any(op.group == "pp" for op in ops):
        return None
    opt = next((i for i, op in enumerate(ops) if op.name.startswith("optimizer/")), len(ops))
    mbs: list[list[int]] = [[] for _ in range(n)]
    for i, op in enumerate(ops[:opt]):
        mbs[op.micro_batch].append(i)
    if not all(mbs) or opt == len(ops):
        return None
    if n == 2:  # the unit is the last micro-batch, followed by the optimizer step
        u, phases, after = 1, mbs + [list(range(opt, len(ops)))], OPT
        if [(ops[i].name, ops[i].stream) for i in mbs[0]] != [(ops[i].name, ops[i].stream) for i in mbs[1]]:
            watch.unsettled = True  # the last micro-batch differs (stages 0-1 reduce only there)
            return None
    else:  # the unit is the one before the last, followed by the last with the optimizer step
        u, phases, after = n - 2, mbs[:n - 1] + [mbs[n - 1] + list(range(opt, len(ops)))], n - 1
    if not {u, after} <= snaps.keys():
        return None
    end = run.end_time
    start = _starts(run)
    b = [min(start[i] for i in idx) for idx in phases]
    e = [max(end[i] for i in idx) for idx in phases]
    period = b[u] - b[u - 1]
    tol = PERIOD_TOL * period
    if period <= 0 or any(e[k] > b[k + 1] for k in range(len(phases) - 1)) or abs(b[u + 1] - b[u] - period) > tol:
        return None  # a boundary is not clean, or the unit is not one period long
    previous, unit = mbs[u - 1], mbs[u]
    if len(previous) != len(unit) or max(start[i] for i in unit) >= b[u + 1]:
        return None  # (splice_events tells the unit's ops from the optimizer's by their start)
    for i, j in zip(previous, unit):
        if (ops[i].name, ops[i].stream) != (ops[j].name, ops[j].stream) or \
                abs(start[j] - start[i] - period) > tol or abs(end[j] - end[i] - period) > tol:
            return None
    added = added_by(run, unit, start)
    if not added.matches(added_by(run, previous, start)):
        return None
    for key, idx in ((u, unit), (after, phases[u + 1])):  # the snapshots are taken before any memory effect
        at = snaps[key].time
        if any((ops[i].frees and end[i] <= at) or (ops[i].allocs and start[i] < at) for i in idx):
            return None
    if snaps[u].memory != snaps[after].memory:
        watch.unsettled = True
        return None  # the allocator has not settled: the unit would not hold the same memory next time
    return u, b[u], b[u + 1], added


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= PERIOD_TOL * max(abs(a), abs(b))


def _starts(run: Any) -> list[float]:
    """When each op of the plan started: as its stream's worker reaches it once its stream predecessor
    and its dependencies have ended (zsim.engine.workers.stream_worker), the later of their ends."""
    ops, end = run.plan.ops, run.end_time
    start = [0.0] * len(ops)
    for indices in run.by_stream:
        previous = 0.0
        for i in indices:
            at = previous
            for d in ops[i].deps:
                if end[d] > at:
                    at = end[d]
            start[i] = at
            previous = end[i]
    return start


def splice_ledger(ledger: MemoryLedger | None, first: float, last: float, extra: int) -> MemoryLedger | None:
    """`ledger` with its timeline in [first, last) (s) repeated `extra` more times, one period (last −
    first) apart, and what came after shifted by extra periods; peaks and the final state are its own
    (a repeated unit reaches no new peak), their times shifted when they fell after the unit."""
    if ledger is None:
        return None
    period = last - first
    times: list[float] = []
    a = bisect.bisect_left(ledger.times, first)  # the timeline's times never decrease
    z = bisect.bisect_left(ledger.times, last, a)
    unit = ledger.times[a:z]
    times += ledger.times[:a]
    for j in range(extra + 1):  # t + j·P: the float addition of the element-wise form, once per copy
        times += map((j * period).__radd__, unit)
    times += map((extra * period).__radd__, ledger.times[z:])
    rows = ledger.rows[:a] + ledger.rows[a:z] * (extra + 1) + ledger.rows[z:]
    reserved = ledger.reserved_rows[:a] + ledger.reserved_rows[a:z] * (extra + 1) + ledger.reserved_rows[z:]
    flushes = [t for t in ledger.flush_times if t < first]
    for j in range(extra + 1):
        flushes += [t + j * period for t in ledger.flush_times if first <= t < last]
    flushes += [t + extra * period for t in ledger.flush_times if t >= last]

    def moved(t: float) -> float:
        return t + extra * period if t >= last else t

    fields = {f.name: getattr(ledger, f.name) for f in dataclasses.fields(MemoryLedger)}  # a plain ledger
    fields.update(times=times, rows=rows, reserved_rows=reserved, flush_times=flushes,
                  peak_time=moved(ledger.peak_time), peak_reserved_time=moved(ledger.peak_reserved_time))
    return MemoryLedger(**fields)


def splice_events(events: list[dict[str, Any]], unit_mb: int, first: float, last: float,
                  extra: int) -> list[dict[str, Any]]:
    """Trace events of the G-micro-batch step from the reduced run's: complete events of micro-batch
    `unit_mb` that start before `last` (those after are the optimizer's, stamped with the last
    micro-batch) and counters in [first, last) (s) repeated with their micro-batch and time moved
    by one period per copy, and later ones moved by `extra` periods and micro-batches."""
    if not events:
        return []
    period_us = (last - first) * 1e6
    first_us, last_us = first * 1e6, last * 1e6
    before, unit, after = [], [], []
    for e in events:
        if e["ph"] == "X":
            mb = e["args"].get("micro_batch", 0)
            (before if mb < unit_mb else unit if mb == unit_mb and e["ts"] < last_us else after).append(e)
        else:
            ts = e["ts"]
            (before if ts < first_us else unit if ts < last_us else after).append(e)
    out = list(before)
    for j in range(extra + 1):
        out += [moved_event(e, j, period_us) for e in unit] if j else unit
    out += [moved_event(e, extra, period_us) for e in after]
    return out


def moved_event(event: dict[str, Any], copies: int, period_us: float) -> dict[str, Any]:
    moved = dict(event)
    moved["ts"] = event["ts"] + copies * period_us
    moved["args"] = dict(event["args"])  # its own: a copy's args are not the original's
    if event["ph"] == "X":
        moved["args"]["micro_batch"] += copies
    return moved

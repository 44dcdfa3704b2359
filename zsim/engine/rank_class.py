"""Per-rank mode with one representative per class of ranks whose timelines are identical so far.

On a GPU cluster every rank runs the same ops for the same seconds; ranks differ only in when their
collectives end, and a collective's group instance ends when its flow on the fabric does (a slow link
slows exactly the instances that cross it). So the quiet ranks (all but rank 0, which records) start
as one class; the class arrives at a collective with all its members at once (the instance counts
its members), and waits for the instances its members belong to. When those end at the same moment
(the symmetric case: every instance's flow gets the same rate) the class goes on whole; when some end
and others do not, the members of the unfinished ones split off into a new class, which carries on
from the same place (the same op of each stream, the same compute in flight). The fabric still moves
one flow per group instance, started in the order of the full simulation, so every rate, end time and
recorded number is the full per-rank simulation's, bit for bit (tests/test_engine_bits.py).

`class_stream` is the actor: one stream of one class, a generator function taking `env`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Generator
from typing import TYPE_CHECKING

import simpy
from simpy.events import PENDING

from zsim.engine.offload import transfer_seconds

if TYPE_CHECKING:
    from zsim.engine.run_state import RunState


class RankClass:
    """Quiet ranks with identical timelines so far: their members, the ops they have finished (a
    byte per op), the events other streams wait on, and per stream the position and what is in
    flight (a Timeout, or (kind, {group instance: its end event}) for a collective)."""

    __slots__ = ("members", "counts", "done", "waiting", "pos", "inflight")

    def __init__(self, run: RunState, members: set[int], done: bytearray, n_streams: int,
                 counts: dict[str, dict[int, int]] | None = None):
        self.members = members
        self.done = done
        self.waiting: dict[int, simpy.Event] = {}
        self.pos = [0] * n_streams
        self.inflight: list[object] = [None] * n_streams
        # per kind ('dp', 'mp'): group instance -> how many members it holds, in instance order
        self.counts = counts if counts is not None else {kind: count(run, kind, members) for kind in ("dp", "mp")}

    def finish(self, i: int) -> None:
        self.done[i] = 1
        event = self.waiting.pop(i, None)
        if event is not None:
            event.succeed()

    def waiter(self, env: simpy.Environment, i: int) -> simpy.Event:
        event = self.waiting.get(i)
        if event is None:
            event = self.waiting[i] = simpy.Event(env)
        return event


def count(run: RunState, kind: str, members: set[int]) -> dict[int, int]:
    """How many of `members` each `kind` group instance holds, in instance order."""
    index = run.s.layout.group_index  # RunState.group_of without its call per member
    return dict(sorted(Counter(index(kind, r) for r in members).items()))


def class_stream(env: simpy.Environment, run: RunState, cls: RankClass, stream: int,
                 indices: list[int]) -> Generator[simpy.Event, None, None]:
    """Run the ops `indices` of one stream for every member of `cls`, from `cls.pos[stream]` on (a
    class split off mid-run resumes what its parent had in flight), each after its dependencies."""
    ops = run.plan.ops
    done = cls.done
    k = cls.pos[stream]
    while k < len(indices):
        i = indices[k]
        op = ops[i]
        cls.pos[stream] = k
        flight = cls.inflight[stream]
        if flight is None:
            for d in op.deps:
                if not done[d]:
                    yield cls.waiter(env, d)
            if op.is_collective:
                flight = cls.inflight[stream] = (op.group, run.arrive_class(i, op, cls.counts[op.group]))
            elif op.transfer:
                flight = cls.inflight[stream] = simpy.Timeout(env, transfer_seconds(op.nbytes, run.s.cluster.offload))
            else:
                flight = cls.inflight[stream] = simpy.Timeout(env, run.compute_time(op, i))
        if type(flight) is tuple:
            yield from _await_instances(env, run, cls, stream, indices)
        else:
            yield flight
        cls.inflight[stream] = None
        cls.finish(i)
        k += 1
    cls.pos[stream] = k


def _await_instances(env: simpy.Environment, run: RunState, cls: RankClass, stream: int,
                     indices: list[int]) -> Generator[simpy.Event, None, None]:
    """Wait until the group instances of the collective in flight on `stream` have ended. Those that
    end together release the class; when some have ended and others have not, the members of the
    unfinished ones split off (`split`) and wait on in a class of their own."""
    while True:
        kind, ends = cls.inflight[stream]
        # Event.triggered is `_value is not PENDING` (simpy/events.py); read in line: this runs over every
        # instance of the collective (1024 at 16k GPUs) each time the class wakes
        unfinished = {g: e for g, e in ends.items() if e._value is PENDING}
        if not unfinished:
            return
        if len(unfinished) < len(ends):
            split(env, run, cls, kind, set(unfinished), indices)
            return
        wake = simpy.Event(env)

        def ring(_event: simpy.Event, wake: simpy.Event = wake) -> None:
            if not wake.triggered:
                wake.succeed()

        for event in unfinished.values():
            event.callbacks.append(ring)
        yield wake


def split(env: simpy.Environment, run: RunState, cls: RankClass, kind: str, groups: set[int],
          indices: list[int]) -> None:
    """Move the members of `cls` in the `kind` group instances `groups` to a new class that resumes
    every stream where `cls` is; each keeps, of the collectives in flight, the instances of its own
    members."""
    moved: set[int] = set()
    ranks = run.s.layout.group_ranks
    for group in groups:  # what it costs is the size of the instances that move, not of the class
        moved.update(cls.members.intersection(ranks(kind, group)))
    cls.members -= moved
    other = "mp" if kind == "dp" else "dp"
    counts = {kind: {g: n for g, n in cls.counts[kind].items() if g in groups}, other: count(run, other, moved)}
    for group in groups:
        del cls.counts[kind][group]
    left = cls.counts[other]
    for group, n in counts[other].items():
        if left[group] == n:
            del left[group]
        else:
            left[group] -= n
    clone = RankClass(run, moved, bytearray(cls.done), len(cls.pos), counts)
    clone.pos = list(cls.pos)
    for owner in (clone, cls):  # the clone first: it reads what `cls` had in flight before `cls` keeps its part
        for s, flight in enumerate(cls.inflight):
            if type(flight) is tuple:
                flight_kind, ends = flight
                mine = owner.counts[flight_kind]
                owner.inflight[s] = (flight_kind, {g: e for g, e in ends.items() if g in mine})
            else:
                owner.inflight[s] = flight
    for s, by_stream in enumerate(run.by_stream):
        if clone.pos[s] < len(by_stream):
            env.process(class_stream(env, run, clone, s, by_stream))

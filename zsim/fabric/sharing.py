"""Links shared by concurrent transfers: a fluid model with weighted max-min fair rates.

Each transfer moves the same number of bytes over each of its links; it may stand for `weight`
identical streams (class mode: the copies of a collective that the other ranks of the class run at
the same moment on the same link). Rates are max-min fair per stream (Bertsekas & Gallager, "Data
Networks", §6.5.2, progressive filling): the most loaded link fixes the rate of its streams, its
capacity is taken out, and the rest is shared again. Rates are re-computed whenever a transfer starts
or ends, so a transfer slows down while another shares its link and speeds up when it leaves.
Max-min fairness is what TCP-like and InfiniBand credit-based flow control converge to for
long-lived flows of equal priority; NCCL's channels are such flows.
"""

from __future__ import annotations

from collections.abc import Generator, Hashable
from dataclasses import dataclass, field

import simpy

# A transfer within this fraction of its size of the end is done (float round-off of rate × time).
_REL_EPS = 1e-9


@dataclass(eq=False, slots=True)
class Transfer:
    links: tuple[tuple[Hashable, float], ...]  # (link, weight: identical streams this transfer stands for)
    total: float  # bytes per stream
    remaining: float  # bytes per stream still to move
    done: simpy.Event
    rate: float = 0.0  # bytes/s per stream


@dataclass(slots=True)
class Fabric:
    """The links of one simulation and the transfers on them. `capacity` maps a link to bytes/s."""

    env: simpy.Environment
    capacity: dict[Hashable, float]
    active: list[Transfer] = field(default_factory=list)
    _last: float = 0.0
    _version: int = 0
    transfers_started: int = 0

    def transfer(self, links: tuple[tuple[Hashable, float], ...], nbytes: float) -> Generator[simpy.Event, None, None]:
        """Move `nbytes` per stream over `links`; returns when done. A simpy process body."""
        if nbytes <= 0:
            return
        for link, weight in links:
            assert link in self.capacity and weight > 0, (link, weight)
        self._advance()
        t = Transfer(links=links, total=float(nbytes), remaining=float(nbytes), done=self.env.event())
        self.active.append(t)
        self.transfers_started += 1
        self._reschedule()
        yield t.done

    def _advance(self) -> None:
        """Bring every active transfer's remaining bytes up to now."""
        dt = self.env.now - self._last
        if dt > 0:
            for t in self.active:
                t.remaining -= t.rate * dt
        self._last = self.env.now

    def _reschedule(self) -> None:
        self._version += 1
        if not self.active:
            return
        max_min_rates(self.active, self.capacity)
        wait = min(t.remaining / t.rate for t in self.active)
        version = self._version
        timer = self.env.timeout(max(wait, 0.0))
        timer.callbacks.append(lambda _event: self._on_timer(version))

    def _on_timer(self, version: int) -> None:
        if version != self._version:
            return  # superseded by a later start or end
        self._advance()
        finished = [t for t in self.active if t.remaining <= _REL_EPS * t.total]
        if not finished:  # round-off left a few bytes: finish the closest
            finished = [min(self.active, key=lambda t: t.remaining / t.rate)]
        for t in finished:
            self.active.remove(t)
            t.done.succeed()
        self._reschedule()


def max_min_rates(transfers: list[Transfer], capacity: dict[Hashable, float]) -> None:
    """Set each transfer's per-stream `rate` to its weighted max-min fair share (progressive filling)."""
    unfixed = set(range(len(transfers)))
    left = dict(capacity)
    while unfixed:
        load: dict[Hashable, float] = {}
        for i in unfixed:
            for link, weight in transfers[i].links:
                load[link] = load.get(link, 0.0) + weight
        bottleneck = min(load, key=lambda link: left[link] / load[link])
        share = left[bottleneck] / load[bottleneck]
        for i in [i for i in unfixed if any(link == bottleneck for link, _ in transfers[i].links)]:
            transfers[i].rate = share
            unfixed.discard(i)
            for link, weight in transfers[i].links:
                left[link] -= share * weight

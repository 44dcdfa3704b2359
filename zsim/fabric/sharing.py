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

import heapq
from collections.abc import Generator, Hashable
from dataclasses import dataclass, field
from functools import partial

import simpy

# A transfer within this fraction of its size of the end is done (float round-off of rate × time).
_REL_EPS = 1e-9
# Solved components and links tuples kept (Fabric._solved, Fabric._keys): a bound on memory, far above
# the shapes a run repeats.
_MAX_SOLVED = 100_000


@dataclass(eq=False, slots=True)
class Transfer:
    links: tuple[tuple[Hashable, float], ...]  # (link, weight: identical streams this transfer stands for)
    total: float  # bytes per stream
    remaining: float  # bytes per stream still to move
    done: simpy.Event
    rate: float = 0.0  # bytes/s per stream
    cap: float | None = None  # bytes/s per stream the endpoints cannot exceed (a private link)
    keys: tuple[Hashable, ...] = ()  # the links without their weights
    mark: int = 0  # the last component search that reached this transfer (Fabric._component)
    entry: int = -1  # the number of its valid entry in Fabric._due (-1: none)
    lists: list = field(default_factory=list)  # Fabric.on_link's list of each of its links, in `keys` order


@dataclass(slots=True)
class Fabric:
    """The links of one simulation and the transfers on them. `capacity` maps a link to bytes/s.

    When a transfer starts or ends only the transfers connected to it through shared links (its
    component) get new rates: max-min fair shares of disjoint components are independent, and this
    keeps thousands of disjoint flows (per-rank mode) cheap."""

    env: simpy.Environment
    capacity: dict[Hashable, float]
    active: dict[Transfer, None] = field(default_factory=dict)  # in the order they started
    on_link: dict[Hashable, list[Transfer]] = field(default_factory=dict)
    _last: float = 0.0
    _version: int = 0
    transfers_started: int = 0
    _searches: int = 0  # component searches so far (each marks the transfers it reaches)
    # Solved components: (id of each transfer's links, its cap) in component order -> (rates, the links
    # tuples themselves, held so that their ids stay theirs). Collectives repeat a few shapes (55,856
    # solves, 176 shapes in the per-rank flagship, issue 28), and a solve is a function of exactly these.
    _solved: dict[tuple, tuple[tuple[float, ...], list]] = field(default_factory=dict)
    # id(links) -> (links, keys, the on_link lists of its links, in its order: an entry of on_link, once
    # made, is never dropped, so these are the lists a start and an end would look up link by link)
    _keys: dict[int, tuple[tuple, tuple[Hashable, ...], list[list[Transfer]]]] = field(default_factory=dict)
    _interned: dict[tuple[Hashable, ...], tuple[Hashable, ...]] = field(default_factory=dict)  # keys, one per value
    # A heap of (seconds to finish at the current rates, entry number, transfer), so that the next end
    # is found without a pass over thousands of transfers per start (per-rank mode at 16k GPUs); an entry
    # is valid while the transfer's `entry` is its number. Stale after time passed: rebuilt on next use.
    _due: list[tuple[float, int, Transfer]] = field(default_factory=list)
    _entries: int = 0
    _stale: bool = True
    # The last timer: its number, when it fires (s; -1: fired) and the version it was made or kept for
    # (_reschedule); it is valid while that version is the current one
    _timers: int = 0
    _timer_at: float = -1.0
    _timer_version: int = -1

    def transfer(self, links: tuple[tuple[Hashable, float], ...], nbytes: float,
                 cap: float | None = None) -> Generator[simpy.Event, None, None]:
        """Move `nbytes` per stream over `links`, at most `cap` bytes/s; returns when done. A simpy
        process body."""
        done = self.start(links, nbytes, cap)
        if done is not None:
            yield done

    def start(self, links: tuple[tuple[Hashable, float], ...], nbytes: float,
              cap: float | None = None) -> simpy.Event | None:
        """Start moving `nbytes` per stream over `links`, at most `cap` bytes/s: the event that
        succeeds when they have arrived (None for no bytes). What `transfer` does, for a process that
        yields the event itself rather than through one more generator."""
        if nbytes <= 0:
            return None
        known = self._keys.get(id(links))
        if known is None or known[0] is not links:  # a links tuple not seen before (collectives reuse theirs)
            for link, weight in links:
                assert link in self.capacity and weight > 0, (link, weight)
            if len(self._keys) >= _MAX_SOLVED:  # a CPU host's compute makes a links tuple per op
                self._keys.clear()
                self._interned.clear()
            keys = tuple(link for link, _ in links)
            keys = self._interned.setdefault(keys, keys)
            known = self._keys[id(links)] = (links, keys, [self.on_link.setdefault(link, []) for link in keys])
        self._advance()
        t = Transfer(links, float(nbytes), float(nbytes), simpy.Event(self.env), 0.0, cap, known[1], lists=known[2])
        self.active[t] = None
        shared = False
        for on in known[2]:  # its links' lists (on_link[link] for each link, in order)
            if on:
                shared = True
            on.append(t)
        self.transfers_started += 1
        # alone on its links, it is its own component (what _component's search would find)
        self._reschedule([t], None if shared else [t] if t.keys else [])
        return t.done

    def _advance(self) -> None:
        """Bring every active transfer's remaining bytes up to now."""
        dt = self.env.now - self._last
        if dt > 0:
            for t in self.active:
                t.remaining -= t.rate * dt
            self._stale = True
        self._last = self.env.now

    def _component(self, seeds: list[Transfer]) -> list[Transfer]:
        """The active transfers that share links, transitively, with `seeds`'s links."""
        if len(seeds) == 1:  # the usual case: a transfer alone on its links (or no one left on them)
            seed = seeds[0]
            alone = True
            for on in seed.lists:  # on_link's list of each of its links
                if on and (len(on) > 1 or on[0] is not seed):
                    alone = False
                    break
            if alone:
                return [seed] if seed.lists and seed.lists[0] else []
            siblings = self._siblings(seed)
            if siblings is not None:
                return siblings
        elif not self._occupied(seeds):  # transfers that just ended, alone on their links: nothing to solve
            return []
        # Depth first from the seeds' links; transfers in the order first reached (max_min_rates's order).
        # The stack of links to visit is kept as segments [a transfer's keys, index of the next to pop],
        # popped from the end: the order of a flat stack of links. Keys are interned by value, so once one
        # segment of a keys tuple is used up every link of it is visited, and its other segments (the
        # other flows of a collective over the same links) are dropped at once instead of link by link.
        self._searches += 1
        search = self._searches
        reached: list[Transfer] = []
        stack = [[t.keys, len(t.keys) - 1] for t in seeds]
        done_links: set[Hashable] = set()
        used_up: set[int] = set()  # ids of keys tuples whose every link is visited
        on_link = self.on_link
        while stack:
            segment = stack[-1]
            keys, i = segment
            if i < 0 or id(keys) in used_up:
                if i < 0:
                    used_up.add(id(keys))
                stack.pop()
                continue
            segment[1] = i - 1
            link = keys[i]
            if link in done_links:
                continue
            done_links.add(link)
            for t in on_link.get(link, ()):
                if t.mark != search:
                    t.mark = search
                    reached.append(t)
                    stack.append([t.keys, len(t.keys) - 1])
        return reached

    def _siblings(self, seed: Transfer) -> list[Transfer] | None:
        """The component of `seed` when every transfer on its links has its very links (the group
        instances of one per-rank collective over the same NICs): the transfers on its last link, in
        their order there, which is the order the search below reaches them in (it starts from that
        link). None otherwise. Costs the links and that one list, not the links times the transfers."""
        keys, lists = seed.keys, seed.lists
        if not keys:
            return None
        last = lists[-1]  # on_link[keys[-1]]
        if not last:
            return None
        for t in last:
            if t.keys is not keys:
                return None
        n = len(last)
        if len({id(t) for t in last}) != n:  # a transfer over one link twice: the search's marks dedupe
            return None
        for on in lists:
            if len(on) != n:  # another transfer on this link (each of `last` is on all of them)
                return None
        return list(last)

    def _occupied(self, seeds: list[Transfer]) -> bool:
        """Whether any link of `seeds` carries a transfer (each interned keys tuple looked at once): the
        64 MP rings of a per-rank collective end together, and a search from all of them found nothing."""
        on_link = self.on_link
        looked: set[int] = set()
        for seed in seeds:
            keys = seed.keys
            if id(keys) in looked:
                continue
            looked.add(id(keys))
            for link in keys:
                if on_link.get(link):
                    return True
        return False

    def _reschedule(self, changed: list[Transfer], component: list[Transfer] | None = None) -> None:
        """New rates for the component of `changed` (`component`: it, where the caller knows it) and the
        timer of the next end."""
        self._version += 1
        if not self.active:
            return
        if component is None:
            component = self._component(changed)
        if component:
            key = tuple([(id(t.links), t.cap) for t in component])
            solved = self._solved.get(key)
            if solved is None:
                max_min_rates(component, self.capacity)
                if len(self._solved) >= _MAX_SOLVED:
                    self._solved.clear()
                self._solved[key] = (tuple([t.rate for t in component]), [t.links for t in component])
            else:
                for t, rate in zip(component, solved[0]):
                    t.rate = rate
        delay = max(self._next_end(component), 0.0)
        if self.env.now + delay == self._timer_at and self._timer_version == self._version - 1:
            # the pending timer already fires then (group instances that start together and end
            # together): it stays valid instead of a new timer per start, each superseding the last
            self._timer_version = self._version
            return
        timer = simpy.Timeout(self.env, delay)  # = env.timeout(), without its lookup
        self._timers += 1
        timer.callbacks.append(partial(self._on_timer, self._timers))
        self._timer_at, self._timer_version = self.env.now + delay, self._version

    def _next_end(self, changed: list[Transfer]) -> float:
        """Seconds until the first active transfer ends at the current rates: the least remaining/rate,
        from the heap of those values (`changed`: the transfers whose rates were just set)."""
        active = self.active
        if len(active) == 1:
            self._stale = True
            t = next(iter(active))
            return t.remaining / t.rate
        due = self._due
        if self._stale:
            due.clear()
            for t in active:
                self._entries += 1
                t.entry = self._entries
                due.append((t.remaining / t.rate, self._entries, t))
            heapq.heapify(due)
            self._stale = False
        else:
            for t in changed:
                self._entries += 1
                t.entry = self._entries
                heapq.heappush(due, (t.remaining / t.rate, self._entries, t))
        while due[0][2].entry != due[0][1]:
            heapq.heappop(due)
        return due[0][0]

    def _on_timer(self, number: int, _timer: simpy.Event | None = None) -> None:
        if number != self._timers or self._timer_version != self._version:
            return  # superseded by a later start or end
        self._timer_at = -1.0
        self._advance()
        finished = [t for t in self.active if t.remaining <= _REL_EPS * t.total]
        if not finished:  # round-off left a few bytes: finish the closest
            finished = [min(self.active, key=lambda t: t.remaining / t.rate)]
        left: list[list[Transfer]] = []  # links' lists that still held a transfer after one of `finished` left
        for t in finished:
            del self.active[t]
            t.entry = -1
            for on in t.lists:
                on.remove(t)
                if on:
                    left.append(on)
            t.done.succeed()
        # none left on their links: nothing to solve (what _component's search would find)
        self._reschedule(finished, None if any(left) else [])


def max_min_rates(transfers: list[Transfer], capacity: dict[Hashable, float]) -> None:
    """Set each transfer's per-stream `rate` to its weighted max-min fair share (progressive filling).
    A transfer's `cap` is a private link of that capacity that only it uses."""
    if len(transfers) == 1:  # alone: its tightest link (class mode's usual case), the same share as below
        t = transfers[0]
        load: dict[Hashable, float] = {}
        for link, weight in t.links:
            load[link] = load.get(link, 0.0) + weight
        rate = min(capacity[link] / n for link, n in load.items())
        t.rate = rate if t.cap is None else min(rate, float(t.cap))
        return
    unfixed = set(range(len(transfers)))
    left = {link: capacity[link] for t in transfers for link, _ in t.links}
    links_of = []
    for i, t in enumerate(transfers):
        links = t.links
        if t.cap is not None:
            left[("cap", i)] = t.cap
            links = links + ((("cap", i), 1.0),)
        links_of.append(links)
    while unfixed:
        load = {}
        for i in unfixed:
            for link, weight in links_of[i]:
                load[link] = load.get(link, 0.0) + weight
        bottleneck = min(load, key=lambda link: left[link] / load[link])
        share = left[bottleneck] / load[bottleneck]
        for i in [i for i in unfixed if any(link == bottleneck for link, _ in links_of[i])]:
            transfers[i].rate = share
            unfixed.discard(i)
            for link, weight in links_of[i]:
                left[link] -= share * weight

"""Complete events on one thread must nest (zsim.trace.tracks): the checker finds a partial overlap,
and lanes() spreads one thread's events so that each lane nests."""

from __future__ import annotations

import random

from zsim.trace.tracks import lanes, partial_overlaps


def span(name, ts, dur, tid=1, pid=0):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "args": {}}


def test_nesting_and_touching_events_pass_and_a_partial_overlap_is_found():
    nested = [span("a", 0, 10), span("b", 2, 3), span("c", 5, 5), span("d", 10, 4), span("e", 10, 0)]
    assert partial_overlaps(nested) == []
    bad = nested + [span("f", 12, 5)]  # starts inside d (10-14), ends after it
    assert [(a["name"], b["name"]) for a, b in partial_overlaps(bad)] == [("d", "f")]


def test_the_same_times_on_other_threads_or_ranks_do_not_overlap():
    assert partial_overlaps([span("a", 0, 10), span("b", 5, 10, tid=2), span("c", 5, 10, pid=1)]) == []


def test_lanes_make_every_lane_nest_with_as_few_lanes_as_first_fit_needs():
    # three gathers each issued before the previous ended (a stage-3 prefetch), and a wait inside the second
    events = [span("g0", 0, 10), span("g1", 5, 10), span("g2", 12, 10), span("wait/arrival/g1", 5, 2)]
    prefer = {id(events[3]): events[1]}
    lane = lanes(events, prefer)
    assert [lane[id(e)] for e in events] == [0, 1, 0, 1]  # the wait sits on its own gather's lane
    moved = [dict(e, tid=lane[id(e)]) for e in events]
    assert partial_overlaps(moved) == []


def test_lanes_of_random_intervals_always_nest():
    rng = random.Random(26)
    for _ in range(50):
        events = [span(f"e{i}", rng.uniform(0, 100), rng.uniform(0, 30)) for i in range(40)]
        lane = lanes(events)
        assert partial_overlaps([dict(e, tid=lane[id(e)]) for e in events]) == []
        assert partial_overlaps(events, limit=1) != [] or max(lane.values()) == 0

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


def test_a_rank_file_is_put_on_lanes_in_place_and_keeps_its_streams():
    """zsim.runtime.merge.lane_rank_file: two gathers that overlap partially on the comm stream (a stage-3
    prefetch) go to two lanes of it; the compute stream and a file without overlaps keep their tids."""
    from zsim.runtime.merge import lane_rank_file
    from zsim.trace.tracks import stream_of

    def doc():
        return {"metadata": {"rank": 0}, "traceEvents": [
            {"ph": "M", "name": "thread_name", "pid": 0, "tid": 1, "args": {"name": "comm"}},
            dict(span("fwd/layer.0", 0, 10, tid=0), args={"step": 0}),
            dict(span("all_gather/params.layer.0", 1, 5, tid=1), args={"seq": 0}),
            dict(span("all_gather/params.layer.1", 4, 6, tid=1), args={"seq": 1})]}

    laned = doc()
    lane_rank_file(laned)
    events = laned["traceEvents"]
    assert partial_overlaps(events) == [] and partial_overlaps(doc()["traceEvents"]) != []
    spans = {e["name"]: e for e in events if e["ph"] == "X"}
    names = ("fwd/layer.0", "all_gather/params.layer.0", "all_gather/params.layer.1")
    assert [spans[n]["tid"] for n in names] == [0, 1, 11]
    assert all(stream_of(e) == (0 if n.startswith("fwd") else 1) for n, e in spans.items())
    assert {"ph": "M", "name": "thread_name", "pid": 0, "tid": 11, "args": {"name": "comm 2"}} in events
    again = {"metadata": laned["metadata"], "traceEvents": [dict(e) for e in events]}
    lane_rank_file(again)
    assert again == laned  # a second merge lays the same lanes out


def test_a_rank_file_written_during_the_run_nests_too(tmp_path):
    """Tracer.write lays the lanes out on every write, so a rank that dies before the merge leaves a file
    viewers accept; the tracer's own events keep their stream tids."""
    import json

    from zsim.runtime.tracer import Tracer

    tracer = Tracer(3)
    tracer.complete("all_gather/params.layer.0", "comm", 10.0, 50.0, op="all_gather", bytes=8, group=[3], seq=0)
    tracer.complete("all_gather/params.layer.1", "comm", 30.0, 70.0, op="all_gather", bytes=8, group=[3], seq=1)
    tracer.write(tmp_path / "rank3.trace.json", {"rank": 3})
    events = json.loads((tmp_path / "rank3.trace.json").read_text())["traceEvents"]
    assert partial_overlaps(events) == []
    assert sorted(e["tid"] for e in events if e["ph"] == "X") == [1, 11]
    assert [e["tid"] for e in tracer.events if e["ph"] == "X"] == [1, 1]

"""zsim.parallel.pipeline: the schedules are complete, deadlock-free, and their bubble is the closed form."""

from __future__ import annotations

import pytest

from zsim.parallel.pipeline import (Work, bubble_fraction, peak_in_flight, pipeline_rank, split_layers,
                                    stage_schedule)


def _run(schedule: str, p: int, m: int, v: int, tf: float, tb: float) -> float:
    """Execute every stage's schedule with forward time tf and backward time tb per chunk and free
    transfers: a chunk's forward waits for the previous virtual stage's, its backward for the next's.
    Returns the step time; fails on a deadlock."""
    items = [stage_schedule(schedule, p, s, m, v) for s in range(p)]
    done: dict[tuple[str, int, int], float] = {}  # (kind, mb, virtual stage) -> end time
    pos, clock = [0] * p, [0.0] * p
    vs = p * v
    progressed = True
    while progressed:
        progressed = False
        for s in range(p):
            if pos[s] == len(items[s]):
                continue
            w = items[s][pos[s]]
            virt = w.chunk * p + s
            if w.kind == "fwd":
                dep = ("fwd", w.mb, virt - 1) if virt > 0 else None
            else:
                dep = ("bwd", w.mb, virt + 1) if virt < vs - 1 else ("fwd", w.mb, virt)
            if dep is not None and dep not in done:
                continue
            start = max(clock[s], done[dep] if dep else 0.0)
            clock[s] = start + (tf if w.kind == "fwd" else tb)
            done[(w.kind, w.mb, virt)] = clock[s]
            pos[s] += 1
            progressed = True
    assert all(pos[s] == len(items[s]) for s in range(p)), f"deadlock at {pos}"
    return max(clock)


@pytest.mark.parametrize("schedule,p,m,v", [("gpipe", 4, 8, 1), ("1f1b", 4, 8, 1), ("1f1b", 8, 3, 1),
                                            ("1f1b", 1, 5, 1), ("interleaved", 4, 8, 2), ("interleaved", 4, 4, 3),
                                            ("interleaved", 2, 6, 4)])
def test_every_chunk_runs_once_forward_before_backward(schedule, p, m, v):
    for s in range(p):
        items = stage_schedule(schedule, p, s, m, v)
        assert sorted(items) == sorted([Work(k, i, c) for k in ("fwd", "bwd") for i in range(m) for c in range(v)])
        assert all(items.index(Work("fwd", i, c)) < items.index(Work("bwd", i, c)) for i in range(m) for c in range(v))


@pytest.mark.parametrize("schedule,p,m,v", [("gpipe", 4, 8, 1), ("1f1b", 4, 8, 1), ("1f1b", 8, 16, 1),
                                            ("interleaved", 4, 8, 2), ("interleaved", 4, 12, 3)])
@pytest.mark.parametrize("tf,tb", [(1.0, 1.0), (1.0, 2.0)])
def test_bubble_is_the_closed_form(schedule, p, m, v, tf, tb):
    """Narayanan et al. 2021 §2.2: bubble (p-1)/m of the ideal step, (p-1)/(v·m) interleaved, when
    every chunk takes the same time. The interleaved bound holds for tf == tb only (its warm-up
    assumes it); with tb = 2·tf it is a lower bound."""
    step = _run(schedule, p, m, v, tf / v, tb / v)
    ideal = m * (tf + tb)
    bubble = (step - ideal) / step
    if schedule == "interleaved" and tf != tb:
        assert bubble >= bubble_fraction(schedule, p, m, v) - 1e-12
    else:
        assert bubble == pytest.approx(bubble_fraction(schedule, p, m, v), rel=1e-12)


def test_in_flight_micro_batches():
    """1F1B holds p - s micro-batches on stage s (Narayanan et al. 2021 §2.2.1), GPipe all m."""
    assert [peak_in_flight(stage_schedule("1f1b", 4, s, 8)) for s in range(4)] == [4, 3, 2, 1]
    assert peak_in_flight(stage_schedule("1f1b", 8, 0, 3)) == 3
    assert peak_in_flight(stage_schedule("gpipe", 4, 3, 8)) == 8
    # interleaved: stage 0 warms up (p-1)·2 + (v-1)·p + 1 chunks before its first backward
    assert peak_in_flight(stage_schedule("interleaved", 4, 0, 8, 2)) == 3 * 2 + 4 + 1


def test_layer_split():
    split = split_layers(24, 4, 2)
    assert split.layers[0] == (range(0, 3), range(12, 15))
    assert split.layers[3] == (range(9, 12), range(21, 24))
    assert split_layers(10, 2, counts=(6, 4)).layers == ((range(0, 6),), (range(6, 10),))
    with pytest.raises(ValueError):
        split_layers(10, 4)
    with pytest.raises(ValueError):
        split_layers(10, 2, counts=(5, 4))


def test_refusals_and_rank_order():
    with pytest.raises(ValueError, match="multiple"):
        stage_schedule("interleaved", 4, 0, 6, 2)
    with pytest.raises(ValueError, match="unknown"):
        stage_schedule("zb-h1", 4, 0, 8)
    # Megatron's order: 2 TP x 2 DP per stage, so ranks 0-3 are stage 0 and 4-7 stage 1
    assert [pipeline_rank(r, tp=2, dp=2) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]

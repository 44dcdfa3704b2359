"""Tracks of a Chrome trace: complete events ("X") on one thread must nest, never partially overlap.

The Chrome trace event format draws the complete events of one thread as a stack: an event that
starts inside another must end inside it too (the format's "X" events are "properly nested"; Perfetto's
JSON importer reports the others as misnested and chrome://tracing draws them wrongly). Measured
collectives on a comm stream can overlap partially (a stage-3 prefetch is issued before the previous
gather ends), so the rank files and the merged trace put them on lanes of their stream (`lanes`; lane j
of the stream on tid t is tid t + 10·j, `stream_of` gives the stream back), and `partial_overlaps`
checks a trace.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

# Times come from floating-point sums (a rank's ts plus its clock offset): ends this close count as equal.
EPS_US = 1e-6
# Lane j >= 1 of the stream on tid t is tid t + LANE_TID_STEP * j (the streams are tids 0-2,
# zsim.trace.schema.STREAM_TID), in the rank files and the merged trace of a measured run alike.
LANE_TID_STEP = 10


def stream_of(event: dict[str, Any]) -> int:
    """The stream tid (zsim.trace.schema.STREAM_TID) of a span, whichever of its stream's lanes it is on."""
    return int(event.get("tid", 0)) % LANE_TID_STEP


def _sorted(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """By start, the longer first (a parent before the children that start with it)."""
    return sorted(events, key=lambda e: (e["ts"], -e["dur"]))


def _end(e: dict[str, Any]) -> float:
    return e["ts"] + e["dur"]


def partial_overlaps(events: list[dict[str, Any]], limit: int = 10) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Up to `limit` pairs (open event, event that starts inside it but ends after it) among the complete
    events of each (pid, tid); an empty list when every thread's events nest."""
    threads: dict[tuple[Any, Any], list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e.get("ph") == "X":
            threads[(e.get("pid"), e.get("tid"))].append(e)
    found: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for spans in threads.values():
        stack: list[dict[str, Any]] = []
        for e in _sorted(spans):
            while stack and _end(stack[-1]) <= e["ts"] + EPS_US:
                stack.pop()
            if stack and _end(e) > _end(stack[-1]) + EPS_US:
                found.append((stack[-1], e))
                if len(found) >= limit:
                    return found
                continue  # keep the stack as it was: one bad event is reported once
            stack.append(e)
    return found


def lanes(events: list[dict[str, Any]], prefer: dict[int, dict[str, Any]] | None = None) -> dict[int, int]:
    """id(event) -> lane (0, 1, ...) for the complete events of one thread, so that the events of each
    lane nest: first fit, in start order, on the first lane where the event ends inside the innermost
    open event (or no event is open). `prefer[id(e)]`, when given, is an event whose lane `e` tries
    first (a `wait/arrival/` span inside its collective)."""
    stacks: list[list[dict[str, Any]]] = []
    lane_of: dict[int, int] = {}
    for e in _sorted(events):
        for stack in stacks:
            while stack and _end(stack[-1]) <= e["ts"] + EPS_US:
                stack.pop()
        fits = [j for j, stack in enumerate(stacks) if not stack or _end(e) <= _end(stack[-1]) + EPS_US]
        wanted = lane_of.get(id(prefer[id(e)])) if prefer and id(e) in prefer else None
        j = wanted if wanted in fits else (fits[0] if fits else len(stacks))
        if j == len(stacks):
            stacks.append([])
        stacks[j].append(e)
        lane_of[id(e)] = j
    return lane_of

"""Measured times on a CPU host with the core sharing taken out (the inverse of zsim.engine.cores).

While a rank's gloo thread moves a collective's bytes, its compute ops run slower, and the collective
too, when the rank has fewer cores than threads (2 ranks on 2 cores: each at half speed). Fitted as
they are, such times would make the profile's compute and gloo terms slower than the host is, and
the simulator, which shares the cores itself, would count the sharing twice. So each measured time
is brought back to what it would have taken alone: a span that ran `o` µs beside the other kind at
speed f did (d − o) + f·o µs of its work alone. Overlap is measured on the rank's own trace, against
the other kind's busy time: for a compute op, the transfer part of the rank's collectives on the comm
track (after the last member arrived: waiting uses no core); for a collective, the compute track's
spans (waits excluded)."""

from __future__ import annotations

from typing import Any

from zsim.engine.cores import speeds
from zsim.trace.intervals import overlap, union
from zsim.trace.tracks import stream_of


def transfer_interval(event: dict[str, Any]) -> tuple[float, float]:
    """(start, end) µs of a collective event's transfer: after the last member arrived (a measured
    run's `last_arrival_ts`, a simulated per-rank run's `wait_us`)."""
    args = event.get("args", {})
    start = event["ts"]
    if "last_arrival_ts" in args:
        start = max(start, args["last_arrival_ts"])
    elif "wait_us" in args:
        start += args["wait_us"]
    return start, event["ts"] + event["dur"]


def comm_busy(events: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """The union of a rank's comm-track collectives' transfers (µs)."""
    return union([transfer_interval(e) for e in events
                  if e.get("ph") == "X" and stream_of(e) == 1 and "op" in e.get("args", {})])


def compute_busy(events: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """The union of a rank's compute-track spans, waits excluded (µs)."""
    return union([(e["ts"], e["ts"] + e["dur"]) for e in events
                  if e.get("ph") == "X" and stream_of(e) == 0 and not e["name"].startswith("wait")])


def compute_alone_us(event: dict[str, Any], busy_comm: list[tuple[float, float]], share: float,
                     threads: int, gloo: float = 0.5) -> float:
    """µs to take off compute span `event` for the time it shared the cores with a collective (which got
    `gloo` of them)."""
    slow = 1.0 - speeds(share, threads, gloo)[0]
    return slow * overlap(event["ts"], event["ts"] + event["dur"], busy_comm) if slow > 0 else 0.0


def collective_alone_us(event: dict[str, Any], busy_compute: list[tuple[float, float]], share: float,
                        threads: int, gloo: float = 0.5) -> float:
    """µs to take off collective `event`'s transfer for the time it shared the cores with compute (getting
    `gloo` of them)."""
    slow = 1.0 - speeds(share, threads, gloo)[1]
    if slow <= 0 or stream_of(event) != 1:  # an in-line collective is the compute track itself
        return 0.0
    lo, hi = transfer_interval(event)
    return slow * overlap(lo, hi, busy_compute)


def gloo_speed_samples(event: dict[str, Any], busy_compute: list[tuple[float, float]],
                       alone_us: float) -> float | None:
    """The collective's speed while it shared the cores with compute, as a fraction of its speed alone:
    a transfer of d µs, o of them beside compute, that takes `alone_us` alone did (d − o) µs of its work
    alone and the rest, alone_us − (d − o), in o µs. None unless compute overlapped at least half of it
    (a shorter overlap says little about the shared speed) and the numbers are consistent."""
    if stream_of(event) != 1:
        return None
    lo, hi = transfer_interval(event)
    d = hi - lo
    o = overlap(lo, hi, busy_compute)
    if d <= 0 or o < 0.5 * d:
        return None
    speed = (alone_us - (d - o)) / o
    return speed if 0 < speed <= 1.0 else None

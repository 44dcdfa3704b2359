"""The one trace schema that simulated and measured runs share (docs/trace-schema.md).

Chrome trace event format (opens in Perfetto and chrome://tracing): a JSON object with
`traceEvents` and a top-level `metadata` block. Times are microseconds. This module only names
things and builds event dicts; it imports neither torch nor simpy, so both halves can use it.
"""

from __future__ import annotations

from typing import Any

SCHEMA = "zsim-trace/1"

# Streams: one thread (track) each, same tid on every rank.
# "tp": TP collectives beside the GEMMs they overlap (zsim.zero.tp_overlap; the simulator only, for now).
STREAMS = ("compute", "comm", "offload", "host", "tp")
STREAM_TID = {name: i for i, name in enumerate(STREAMS)}

# Memory categories of the counter events, in bytes.
# `context` (simulator only): CUDA context, cuBLAS workspace and NCCL buffers, outside the allocator.
CATEGORIES = ("params", "grads", "optimizer", "activations", "buffers", "context", "fragmentation")

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all")


def layer_event(phase: str, layer: int | str) -> str:
    """`fwd/layer.12`, `bwd/layer.12`, `recompute/layer.12`; non-numbered modules: `fwd/embed`."""
    return f"{phase}/layer.{layer}" if isinstance(layer, int) else f"{phase}/{layer}"


def collective_event(op: str, what: str) -> str:
    """`all_gather/params.layer.12`, `reduce_scatter/grads.bucket.3`, `all_reduce/mp.layer.4`."""
    assert op in COLLECTIVES, op
    return f"{op}/{what}"


def wait_event(collective: str) -> str:
    """`wait/all_gather/params.layer.12`: a measured rank waiting for that collective to finish."""
    return f"wait/{collective}"


def complete(name: str, pid: int, stream: str, ts_us: float, dur_us: float, **args: Any) -> dict[str, Any]:
    """A complete ("X") event on `stream` of process `pid`."""
    return {"ph": "X", "name": name, "cat": stream, "pid": pid, "tid": STREAM_TID[stream],
            "ts": ts_us, "dur": dur_us, "args": args}


def counter(name: str, pid: int, ts_us: float, values: dict[str, float]) -> dict[str, Any]:
    """A counter ("C") event, e.g. name="memory" with one value per category in bytes."""
    return {"ph": "C", "name": name, "pid": pid, "ts": ts_us, "args": values}


def process_meta(pid: int, label: str) -> list[dict[str, Any]]:
    """Metadata events that name process `pid` and its stream threads."""
    events = [{"ph": "M", "name": "process_name", "pid": pid, "args": {"name": label}}]
    events += [{"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": stream}}
               for stream, tid in STREAM_TID.items()]
    return events


def document(events: list[dict[str, Any]], metadata: dict[str, Any]) -> dict[str, Any]:
    """The whole trace file's JSON object."""
    return {"schema": SCHEMA, "displayTimeUnit": "ms", "metadata": metadata, "traceEvents": events}


def group_ranks(args: dict[str, Any], metadata: dict[str, Any]) -> list[int]:
    """The global ranks of a collective event's process group: `args["group"]` is either the list
    itself (measured traces) or the name of a group listed once in `metadata["groups"]` (simulated
    traces: one list per group instead of one per event)."""
    group = args["group"]
    return list(metadata["groups"][group]) if isinstance(group, str) else list(group)

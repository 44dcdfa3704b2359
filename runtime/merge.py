"""After a run: facts that need every rank's trace.

- `last_arrival_ts` on each collective: the same collective is matched across ranks by its group
  and `seq`; the latest issue time among the members (on rank 0's clock, via each file's
  `clock_offset_us`) is written back on each rank's own clock. `ts + dur - last_arrival_ts` is
  then the collective's time without waiting for stragglers, and the wait itself becomes its own
  event, `wait/arrival/<collective>`, on the collective's track.
- lanes: each rank file's spans that would partially overlap on their stream's thread go to lanes of
  it (tid t + 10·j, `lane_rank_file`), so that every thread's spans nest.
- `summary.json`: the loss per step (mean over DP ranks = the loss of the global batch), model
  state bytes per rank, and per-step collective bytes.
- `trace.json`: one trace of all ranks, clock-aligned: each rank's events shifted by its
  `clock_offset_us` onto rank 0's clock, `pid` = rank, the metadata that all ranks share plus
  `ranks` and, per rank, what differs (`per_rank`: rank, clock offset, model states, host facts).

Run by the launcher; after a torchrun job, copy the rank files into one folder and run
`python -m zsim.runtime.merge DIR`.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from zsim.trace.schema import complete, document
from zsim.trace.tracks import LANE_TID_STEP, stream_of


def load_traces(out_dir: Path) -> dict[int, dict[str, Any]]:
    """rank -> trace document, for every rank<R>.trace.json in `out_dir`, each checked as a whole
    (check_trace) before anything is merged or written.

    Raises:
        ConfigError: a file that is not a trace (not UTF-8, not JSON, no metadata.rank), or one that
        check_trace refuses.
    """
    from zsim.config.yamlfile import read_json
    from zsim.errors import ConfigError

    traces = {}
    for path in sorted(out_dir.glob("rank*.trace.json")):
        doc = read_json(path, what="trace")
        try:
            rank = doc["metadata"]["rank"]
            if not isinstance(doc["traceEvents"], list) or isinstance(rank, bool) or not isinstance(rank, int):
                raise TypeError
        except (KeyError, TypeError):
            raise ConfigError("not a zsim trace (needs traceEvents and metadata.rank)", source=str(path)) from None
        check_trace(doc, path)
        traces[rank] = doc
    return traces


def check_trace(doc: dict[str, Any], path: Path) -> None:
    """One rank's trace holds what merging reads: its name says its metadata.rank (a second file
    claiming a rank would overwrite the first), a finite metadata.clock_offset_us, every event as
    zsim.trace.run_reader.check_events wants it, and each collective's group a list of ranks with
    op, bytes, seq, step and micro_batch on a known stream.

    Raises:
        ConfigError: naming the file, the event and the field.
    """
    import math

    from zsim.errors import ConfigError, short
    from zsim.trace.run_reader import check_events
    from zsim.trace.schema import STREAM_TID

    meta = doc["metadata"]
    if path.name != f"rank{meta['rank']}.trace.json":
        raise ConfigError(f"metadata.rank is {meta['rank']}: the file of that rank is rank{meta['rank']}.trace.json "
                          "(two files of one rank?)", source=str(path))
    offset = meta.get("clock_offset_us")
    if not isinstance(offset, (int, float)) or isinstance(offset, bool) or not math.isfinite(offset):
        raise ConfigError(f"metadata.clock_offset_us {short(offset)} is not a finite number", source=str(path))
    check_events(doc["traceEvents"], path)
    for i, event in enumerate(doc["traceEvents"]):
        problem = _collective_problem(event, STREAM_TID) if is_collective(event) else None
        if problem:
            raise ConfigError(f"traceEvents[{i}] ({event['name']}): {problem}", source=str(path))


def _collective_problem(event: dict[str, Any], streams: dict[str, int]) -> str | None:
    """What merging cannot use in a collective's event, or None."""
    from zsim.errors import short

    args = event["args"]
    missing = [k for k in ("op", "bytes", "seq", "step", "micro_batch") if k not in args]
    if missing:
        return f"a collective without args.{', args.'.join(missing)}"
    if not isinstance(args["group"], list):
        return f"args.group {short(args['group'])} is not a list of ranks"
    if event.get("cat") not in streams:
        return f"cat {short(event.get('cat'))} is not a stream ({', '.join(streams)})"
    return None


def load_summaries(out_dir: Path) -> dict[int, dict[str, Any]]:
    """rank -> rank summary, for every rank<R>.summary.json in `out_dir`.

    Raises:
        ConfigError: not JSON, or a summary without an integer rank matching its name, a list of
        numeric losses, as many finite step_seconds >= 0, and model_states.
    """
    import math

    from zsim.config.yamlfile import read_json
    from zsim.errors import ConfigError, short

    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    ranks = {}
    for path in sorted(out_dir.glob("rank*.summary.json")):
        data = read_json(path, what="rank summary")
        rank = data.get("rank") if isinstance(data, dict) else None
        if not isinstance(rank, int) or isinstance(rank, bool) or path.name != f"rank{rank}.summary.json":
            raise ConfigError(f"not a rank summary: rank {short(rank)} is not the rank its name says",
                              source=str(path))
        losses, seconds = data.get("losses"), data.get("step_seconds")
        if not isinstance(losses, list) or not all(number(v) for v in losses):
            raise ConfigError(f"losses {short(losses)} is not a list of numbers", source=str(path))
        if not isinstance(seconds, list) or len(seconds) != len(losses) or not all(
                number(v) and math.isfinite(v) and v >= 0 for v in seconds):
            raise ConfigError(f"step_seconds {short(seconds)} is not {len(losses)} finite numbers >= 0 (one per "
                              "loss)", source=str(path))
        if "model_states" not in data:
            raise ConfigError("no model_states", source=str(path))
        ranks[rank] = data
    return ranks


ARRIVAL = "wait/arrival/"


def fill_last_arrival(traces: dict[int, dict[str, Any]]) -> int:
    """Set `args.last_arrival_ts` where every member's event is present, and add the wait for the
    last member as its own event, `wait/arrival/<collective>` on the collective's track from its issue
    to the last arrival (when this rank was not the last); returns how many were set."""
    members: dict[tuple, list[tuple[int, dict]]] = defaultdict(list)
    for rank, doc in traces.items():
        doc["traceEvents"] = [e for e in doc["traceEvents"] if not e.get("name", "").startswith(ARRIVAL)]
        for event in doc["traceEvents"]:
            if is_collective(event):  # either track
                members[(tuple(event["args"]["group"]), event["args"]["seq"])].append((rank, event))
    filled = 0
    for (group, _), found in members.items():
        if len(found) != len(group):
            continue  # a rank stopped early: arrival unknown
        offsets = {rank: traces[rank]["metadata"]["clock_offset_us"] for rank, _ in found}
        for rank, event in found:  # on this rank's clock; its own issue time exactly, not via offsets
            last = max(other["ts"] if m == rank else other["ts"] + offsets[m] - offsets[rank] for m, other in found)
            event["args"]["last_arrival_ts"] = last
            filled += 1
            if last > event["ts"]:
                args = event["args"]
                traces[rank]["traceEvents"].append(complete(
                    ARRIVAL + event["name"], event["pid"], event["cat"], event["ts"], min(last, event["ts"] + event["dur"])
                    - event["ts"], step=args["step"], micro_batch=args["micro_batch"], seq=args["seq"],
                    **{"for": event["name"]}))
    return filled


def step_volumes(doc: dict[str, Any]) -> dict[int, dict[str, int]]:
    """step -> {op: bytes} over this rank's data-parallel collectives (nccl-tests bytes), plus
    `paper_bytes`: 2 x all_reduce + reduce_scatter + all_gather, the ZeRO paper's per-rank volume
    (§7: an all-reduce is a reduce-scatter and an all-gather, each moving the buffer once), and
    `mp_all_reduce`: the bytes of Megatron's MP all-reduces (not part of the ZeRO volume), and
    `checks`: the optimizer's overflow and gradient-norm all-reduces (4 bytes each, DP and MP)."""
    volumes: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for event in doc["traceEvents"]:
        args = event.get("args", {})
        if not is_collective(event):
            continue
        step = volumes[args["step"]]
        if is_check(event):  # the optimizer's overflow flag and gradient norm: 4 bytes, not model states
            step["checks"] += args["bytes"]
            continue
        if "/mp." in event["name"]:
            step["mp_all_reduce"] += args["bytes"]
            continue
        step[args["op"]] += args["bytes"]
        step["paper_bytes"] += args["bytes"] * (2 if args["op"] == "all_reduce" else 1)
    return {s: dict(v) for s, v in volumes.items()}


def is_check(event: dict[str, Any]) -> bool:
    """The optimizer's 4-byte agreement all-reduces: `all_reduce/overflow.dp`, `all_reduce/norm.mp`..."""
    return event["name"].startswith(("all_reduce/overflow.", "all_reduce/norm."))


def is_collective(event: dict[str, Any]) -> bool:
    """A collective's complete event (on either track): it names its group's ranks. A pipeline's
    point-to-point transfer (`send/pp.fwd`...: `group: "pp"`, runtime/p2p.py) is not one."""
    return event.get("ph") == "X" and "group" in event.get("args", {}) and event["args"].get("group") != "pp"


PER_RANK_KEYS = ("rank", "clock_offset_us", "model_states", "host", "host_facts", "device")
# Extra tracks: lane j >= 1 of the stream on tid t is tid t + LANE_TID_STEP * j (zsim.trace.tracks, in the
# rank files and the merged trace); the merged trace's ProfilerStep#N spans are on STEP_TID.
STEP_TID = 9


def merged_trace(traces: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """One trace document of every rank on rank 0's clock (see the module docstring), for viewers:
    each stream's events split over lanes so that no two on one thread partially overlap
    (zsim.trace.tracks), a `ProfilerStep#N` span per step and rank, and each span's track in
    `args.stream` (what Holistic Trace Analysis takes for a device stream)."""
    events: list[dict[str, Any]] = []
    for rank, doc in sorted(traces.items()):
        offset = doc["metadata"]["clock_offset_us"]
        spans, others = [], []
        for event in doc["traceEvents"]:
            event = dict(event, pid=rank)
            if "ts" in event:
                event["ts"] = event["ts"] + offset
                if "last_arrival_ts" in event.get("args", {}):
                    event["args"] = dict(event["args"], last_arrival_ts=event["args"]["last_arrival_ts"] + offset)
            if event.get("ph") == "M" and event.get("tid", 0) >= LANE_TID_STEP:
                continue  # a rank file's lane names: _on_lanes names the merged trace's own
            (spans if event.get("ph") == "X" else others).append(event)
        events += others + _on_lanes(rank, spans) + _profiler_steps(rank, spans)
    first = traces[min(traces)]["metadata"]
    metadata = {k: v for k, v in first.items() if k not in PER_RANK_KEYS}
    metadata.update(ranks=sorted(traces), clock_aligned=True, clock_offset_us=0.0,
                    per_rank={r: {k: d["metadata"].get(k) for k in PER_RANK_KEYS} for r, d in sorted(traces.items())})
    return document(events, metadata)


def _on_lanes(rank: int, spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`spans` of one rank (copies), each stream's on as many lanes as its overlaps need, each lane a
    thread of its own named after its stream (`comm`, `comm 2`, ...), with `args.stream` its tid."""
    from zsim.trace.schema import STREAM_TID
    from zsim.trace.tracks import lanes

    names = {tid: name for name, tid in STREAM_TID.items()}
    by_tid: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for e in spans:  # by stream: a rank file's spans may already be on lanes (lane_rank_file)
        by_tid[stream_of(e)].append(e)
    lane: dict[int, int] = {}
    threads = []
    for tid, group in sorted(by_tid.items()):
        collectives = {(e["name"], e["args"].get("seq")): e for e in group if is_collective(e)}
        prefer = {id(e): collectives[(e["args"]["for"], e["args"].get("seq"))] for e in group
                  if e["name"].startswith(ARRIVAL) and (e["args"].get("for"), e["args"].get("seq")) in collectives}
        on_lanes = lanes(group, prefer)
        lane.update(on_lanes)
        threads += [(tid, j) for j in range(1, max(on_lanes.values(), default=0) + 1)]
    out = []
    for e in spans:  # in the rank file's order
        new = stream_of(e) + LANE_TID_STEP * lane[id(e)]
        out.append(dict(e, tid=new, args=dict(e["args"], stream=new)))
    for tid, j in threads:
        name = f"{names.get(tid, tid)} {j + 1}"
        out.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid + LANE_TID_STEP * j,
                    "args": {"name": name}})
    for tid in {*by_tid, *(t + LANE_TID_STEP * j for t, j in threads)}:
        base, j = tid % LANE_TID_STEP, tid // LANE_TID_STEP  # under their stream, in lane order
        out.append({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": tid,
                    "args": {"sort_index": 1 + 100 * base + j}})
    return out


def lane_rank_file(doc: dict[str, Any], rank: int | None = None) -> None:
    """Put a rank file's spans on lanes of their stream, in place, so that the spans of every thread
    nest (a stage-3 prefetch is issued before the previous gather ends; Perfetto and chrome://tracing
    refuse partial overlaps on one thread): the merged trace's lanes (`_on_lanes`), with each stream's
    lane 0 its own tid, so a file without overlaps is unchanged. Readers take a span's stream from
    zsim.trace.tracks.stream_of. Idempotent: merging a folder again lays the lanes out anew. `rank`:
    the process the lane names belong to (default: metadata.rank)."""
    rank = doc["metadata"]["rank"] if rank is None else rank
    events = [e for e in doc["traceEvents"] if not (e.get("ph") == "M" and e.get("tid", 0) >= LANE_TID_STEP)]
    spans = [e for e in events if e.get("ph") == "X"]
    laned = iter(_on_lanes(rank, spans))
    moved = {id(old): next(laned) for old in spans}  # _on_lanes returns the spans first, in order
    names = [e for e in laned if e["name"] == "thread_name"]
    out = []
    for e in events:
        if e.get("ph") != "X":
            out.append(e)
            continue
        new = moved[id(e)]
        args = {k: v for k, v in new["args"].items() if k != "stream"}  # the merged trace's, for HTA
        out.append(dict(e, tid=new["tid"], args=args))
    doc["traceEvents"] = out + names


def _profiler_steps(rank: int, spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A `ProfilerStep#N` span per step N of the rank, as torch.profiler marks its steps (Holistic Trace
    Analysis finds iterations by them): from the first compute-track event of step N to the first of
    step N+1 (the last step: to the end of its last event), so that the steps never overlap."""
    starts: dict[int, float] = {}
    ends: dict[int, float] = {}
    for e in spans:
        step = e.get("args", {}).get("step")
        if step is None:
            continue
        if stream_of(e) == 0:
            starts[step] = min(starts.get(step, e["ts"]), e["ts"])
        ends[step] = max(ends.get(step, e["ts"] + e["dur"]), e["ts"] + e["dur"])
    order = sorted(starts)
    out = [{"ph": "M", "name": "thread_name", "pid": rank, "tid": STEP_TID, "args": {"name": "steps"}},
           {"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": STEP_TID, "args": {"sort_index": 0}}]
    for step, after in zip(order, order[1:] + [None]):
        end = starts[after] if after is not None else ends[step]
        out.append({"ph": "X", "name": f"ProfilerStep#{step}", "cat": "user_annotation", "pid": rank, "tid": STEP_TID,
                    "ts": starts[step], "dur": max(0.0, end - starts[step]), "args": {"step": step}})
    return out


def merge(out_dir: Path) -> dict[str, Any]:
    """Fill in last_arrival_ts in every trace file, write the merged trace.json and summary.json;
    returns the summary.

    Raises:
        ConfigError: a rank trace or summary that load_traces or load_summaries refuses (nothing is
        written then).
    """
    traces = load_traces(out_dir)
    ranks = load_summaries(out_dir)  # checked before anything is written
    fill_last_arrival(traces)
    from zsim.report.outputs import write_atomic

    for rank, doc in traces.items():
        lane_rank_file(doc)
        write_atomic(out_dir / f"rank{rank}.trace.json", json.dumps(doc))
    if traces:
        write_atomic(out_dir / "trace.json", json.dumps(merged_trace(traces)))
    steps = min((len(r["losses"]) for r in ranks.values()), default=0)
    losses = [sum(r["losses"][s] for r in ranks.values()) / len(ranks) for s in range(steps)]
    summary = {
        "ranks": sorted(ranks),
        "losses": losses,
        "metadata": next(iter(traces.values()))["metadata"] if traces else {},
        "model_states": {rank: r["model_states"] for rank, r in ranks.items()},
        "peak_bytes": {rank: r.get("peak_bytes") for rank, r in ranks.items()},
        "step_seconds": [max(r["step_seconds"][s] for r in ranks.values()) for s in range(steps)],
        "collective_bytes": {rank: step_volumes(doc) for rank, doc in traces.items()},
    }
    write_atomic(out_dir / "summary.json", json.dumps(summary, indent=1))
    return summary


def main(argv: list[str] | None = None) -> int:
    """`python -m zsim.runtime.merge DIR`: exit 0, or 2 with a one-line error (no traceback)."""
    import argparse

    from zsim.console.parser import Parser, error_text
    from zsim.errors import ZsimError

    parser: argparse.ArgumentParser = Parser(prog="python -m zsim.runtime.merge",
                                             description="Merge the rank traces of a run folder (summary.json).")
    parser.add_argument("folder", type=Path, help="folder with rank<R>.trace.json and rank<R>.summary.json")
    args = parser.parse_args(argv)
    try:
        if not args.folder.is_dir():
            raise ZsimError(f"{args.folder}: not a folder")
        if not any(args.folder.glob("rank*.trace.json")):
            raise ZsimError(f"{args.folder}: no rank<R>.trace.json files to merge")
        merge(args.folder)
    except ZsimError as exc:
        print(error_text(f"runtime.merge: {exc}"), file=sys.stderr)
        return exc.exit_code
    except (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError, AttributeError) as exc:
        print(error_text(f"runtime.merge: {args.folder}: the rank files do not fit together "
                         f"({type(exc).__name__}: {exc})"), file=sys.stderr)
        return 2
    except OSError as exc:
        print(error_text(f"runtime.merge: {exc.filename or args.folder}: {exc.strerror or exc}"), file=sys.stderr)
        return 2
    print(f"merged {args.folder}/summary.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())

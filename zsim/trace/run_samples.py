"""The samples a measured run gives calibration: each collective's transfer time, waiting excluded, and
each compute phase's time and FLOPs (zsim.trace.samples' records), from a run zsim.trace.run_reader read
and checked as a whole."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from zsim.errors import ConfigError
from zsim.trace.samples import CollectiveSample, ComputeSample
from zsim.trace.tracks import stream_of

if TYPE_CHECKING:
    from zsim.trace.run_reader import MeasuredRun

_HOST_WAIT_EPS_US = 1.0  # a wait() that blocked less than this found the op already done (timer resolution ~1 us)


def is_waiting(event: dict[str, Any]) -> bool:
    """A `wait/...` span: a thread waiting (for a collective, or for the last member to arrive), never
    transfer nor compute, whatever args it carries."""
    return str(event.get("name", "")).startswith("wait/")


def collective_samples(run: MeasuredRun, skipped: dict[str, int] | None = None,
                       shared_us: Callable[[int, dict[str, Any]], float] | None = None) -> list[CollectiveSample]:
    """Every collective of every rank as a transfer time: from the last member's arrival to the end
    (`ts + dur - last_arrival_ts`, written by zsim.runtime.merge), so that waiting for a straggler is not
    fitted as transfer. Each rank's own view is kept (ranks may see the end at slightly different
    moments); MP all-reduces inside the compute track count alike. Calls without information about the
    link (zero bytes, a group of one, no time after the last arrival) are counted in `skipped` by reason.
    `shared_us(rank, event)`, when given, is taken off each transfer: the time a CPU host's collective
    lost sharing the cores with compute (zsim.calibrate.core_sharing).

    How the span was timed (`args.timing`) decides what its end means:
    - `cuda_event`: start and end are CUDA events on the collective's stream, i.e. its kernel: the end
      is the transfer's end (and the start, each member's arrival on the device).
    - `host` (or absent: traces before issue 26): host clock, the end from the op's completion callback
      (gloo) or from the return of the caller's `wait()`. On a GPU that end is when the host got round to
      waiting (an NCCL future completes at enqueue), not the transfer's: such calls are skipped. On a
      CPU, a `wait()` that did not block (`blocked_us` < 1 us) while the end is not before it found the
      op long done: the end is the host's lateness, not the transfer's, and the call is skipped.
    `wait/...` spans are waiting (is_waiting), never samples.

    Raises:
        ConfigError: a collective without `last_arrival_ts` (an unmerged trace) or without bytes/group.
    """
    out = []
    backend = str(run.metadata.get("backend", "gloo"))
    on_gpu = backend == "nccl" or str(run.metadata.get("device", "cpu")).startswith("cuda")
    for rank, events in run.events.items():
        path = run.folder / f"rank{rank}.trace.json"
        waits = {(e["args"].get("for"), e["args"].get("seq")): e for e in events
                 if is_waiting(e) and not e["name"].startswith("wait/arrival/")}
        for e in events:
            args = e.get("args", {})
            if "group" not in args or "op" not in args or is_waiting(e):
                continue
            if "last_arrival_ts" not in args:
                raise ConfigError(f"{e['name']} (step {args.get('step')}) has no last_arrival_ts: the traces were not "
                                  "merged (python -m zsim.runtime.merge DIR)", source=str(path))
            if not isinstance(args.get("bytes"), int) or not isinstance(args["group"], list):
                raise ConfigError(f"{e['name']}: bytes or group missing", source=str(path))
            timing = args.get("timing", "host")  # check_events took only TIMINGS
            transfer_us = e["ts"] + e["dur"] - args["last_arrival_ts"]
            if shared_us is not None and transfer_us > 0 and timing == "host":
                transfer_us -= shared_us(rank, e)
            wait = waits.get((e["name"], args.get("seq")))
            reason = ("zero bytes" if args["bytes"] <= 0 else "a group of one rank" if len(args["group"]) < 2
                      else _host_end_reason(e, wait, on_gpu) if timing == "host" else None)
            if reason is None and transfer_us <= 0:
                reason = "no time after the last arrival (clock skew)"
            if reason:  # no information about the link: counted, reported by calibrate
                if skipped is not None:
                    skipped[reason] = skipped.get(reason, 0) + 1
                continue
            out.append(CollectiveSample(args["op"], args["bytes"], len(args["group"]), transfer_us * 1e-6, backend,
                                        str(run.folder), 1, args.get("dtype", "fp32")))
    return out


def _host_end_reason(event: dict[str, Any], wait: dict[str, Any] | None, on_gpu: bool) -> str | None:
    """Why a host-timed collective's end is not its transfer's end, or None when it is (see
    collective_samples): on a GPU never; on a CPU when the caller's wait did not block and the end is
    not before the wait began (the end was when the host got round to waiting)."""
    if on_gpu:
        return "host-timed on a GPU (the end is when the host waited, not when the transfer ended)"
    blocked = event["args"].get("blocked_us")
    started = wait["ts"] if wait is not None else None
    if blocked is not None and started is not None and blocked < _HOST_WAIT_EPS_US \
            and event["ts"] + event["dur"] >= started:
        return "ended when the host got round to waiting (the wait did not block)"
    return None


def compute_samples(run: MeasuredRun) -> list[ComputeSample]:
    """Every compute phase (`fwd/...`, `bwd/...`, `recompute/...`, `optimizer/step`) of every rank,
    with its FLOPs (from the trace) and measured seconds; the kind is the phase and the module kind
    (`fwd/layer`, `bwd/head`, ...)."""
    dtype = str(run.metadata.get("precision", "fp32"))
    out = []
    for rank, events in run.events.items():
        for e in events:
            if stream_of(e) != 0 or "op" in e.get("args", {}) or is_waiting(e) or e["name"].split("/")[0] not in (
                    "fwd", "bwd", "recompute", "optimizer"):
                continue
            phase, _, what = e["name"].partition("/")
            kind = f"{phase}/{what.split('.')[0]}"
            args = e.get("args", {})
            out.append(ComputeSample(kind, float(args.get("flops", 0.0)), e["dur"] * 1e-6, dtype,
                                     str(run.folder / f"rank{rank}.trace.json"), name=e["name"],
                                     nbytes=float(args.get("elements", 0))))
    return out

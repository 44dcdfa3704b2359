"""A measured collective's transfer time depends on how its span was timed (issue 26): CUDA events on
the collective's stream are the transfer; a host clock on a GPU is when the host waited; a `wait/`
span is waiting, never transfer nor compute. Synthetic traces of two ranks."""

from __future__ import annotations

from pathlib import Path

import pytest

from zsim.errors import ConfigError
from zsim.trace.run_reader import MeasuredRun, check_events
from zsim.trace.run_samples import collective_samples, compute_samples


def collective(ts, dur, last, name="reduce_scatter/grads.bucket.0", tid=1, **args):
    return {"ph": "X", "name": name, "cat": "comm" if tid == 1 else "compute", "pid": 0, "tid": tid, "ts": ts,
            "dur": dur, "args": {"op": name.split("/")[0], "bytes": 1 << 20, "dtype": "fp16", "group": [0, 1],
                                 "step": 1, "micro_batch": 0, "seq": 3, "last_arrival_ts": last, **args}}


def wait(ts, dur, of="reduce_scatter/grads.bucket.0", seq=3, **args):
    return {"ph": "X", "name": f"wait/{of}", "cat": "compute", "pid": 0, "tid": 0, "ts": ts, "dur": dur,
            "args": {"for": of, "seq": seq, "step": 1, "micro_batch": 0, **args}}


def run_of(events, backend="nccl", device="cuda:0") -> MeasuredRun:
    check_events(events, Path("rank0.trace.json"))
    return MeasuredRun(Path("run"), {"backend": backend, "device": device, "world_size": 2, "precision": "fp16"},
                       {0: events}, {0: []}, {0: 0.0})


def test_a_cuda_event_span_is_the_transfer_after_the_last_arrival():
    """The kernel started on this GPU at 100 and ended at 160; the other member's kernel started at 130
    (last_arrival_ts, merged from the members' device starts): 30 us of transfer, 30 of waiting for it.
    The host's wait (long after, 900 us) is no part of it."""
    events = [collective(100.0, 60.0, 130.0, timing="cuda_event", blocked_us=0.0), wait(1000.0, 0.5)]
    skipped: dict[str, int] = {}
    samples = collective_samples(run_of(events), skipped)
    assert [round(s.seconds * 1e6, 6) for s in samples] == [30.0] and skipped == {}


def test_a_host_timed_collective_on_a_gpu_is_not_taken_as_transfer():
    """Before issue 26 the runtime ended an NCCL collective when the host returned from wait() and
    synchronised: that is when the host got round to it (here 900 us later), not the transfer."""
    events = [collective(100.0, 900.0, 130.0, timing="host", blocked_us=0.2), wait(999.8, 0.2)]
    skipped: dict[str, int] = {}
    assert collective_samples(run_of(events), skipped) == []
    assert skipped == {"host-timed on a GPU (the end is when the host waited, not when the transfer ended)": 1}
    without = [collective(100.0, 900.0, 130.0, blocked_us=0.2)]  # an older trace, no args.timing: the same
    assert collective_samples(run_of(without)) == []


@pytest.mark.parametrize("end, blocked, kept", [
    (400.0, 0.0, True),     # the completion callback fired at 400, before the host began waiting at 900
    (950.0, 50.0, True),    # the host blocked 50 us in wait(): the op ended then (it was still running)
    (900.2, 0.2, False),    # gloo's reduce_scatter has no callback: wait() returned at once at 900.2
])
def test_a_host_timed_gloo_collective_is_transfer_unless_its_end_is_the_hosts_late_wait(end, blocked, kept):
    events = [collective(100.0, end - 100.0, 130.0, timing="host", blocked_us=blocked),
              wait(900.0, end - 900.0 if end > 900.0 else 0.1)]
    skipped: dict[str, int] = {}
    samples = collective_samples(run_of(events, backend="gloo", device="cpu"), skipped)
    assert [round(s.seconds * 1e6, 6) for s in samples] == ([end - 130.0] if kept else [])
    assert skipped == ({} if kept else {"ended when the host got round to waiting (the wait did not block)": 1})


def test_a_wait_span_is_never_transfer_nor_compute_whatever_its_args():
    """A `wait/` span that carries a collective's args (op, bytes, group) is still waiting."""
    spans = [collective(100.0, 60.0, 130.0, timing="cuda_event"),
             wait(200.0, 80.0, op="reduce_scatter", bytes=1 << 20, group=[0, 1], last_arrival_ts=0.0),
             {"ph": "X", "name": "wait/arrival/all_reduce/mp.layer.0", "cat": "compute", "pid": 0, "tid": 0,
              "ts": 300.0, "dur": 5.0, "args": {"op": "all_reduce", "bytes": 8, "group": [0, 1], "step": 1,
                                                "micro_batch": 0, "last_arrival_ts": 0.0, "flops": 0.0}},
             {"ph": "X", "name": "bwd/layer.0", "cat": "compute", "pid": 0, "tid": 0, "ts": 400.0, "dur": 9.0,
              "args": {"step": 1, "micro_batch": 0, "flops": 1e6}}]
    run = run_of(spans)
    assert [round(s.seconds * 1e6, 6) for s in collective_samples(run)] == [30.0]
    assert [s.name for s in compute_samples(run)] == ["bwd/layer.0"]


def test_a_timing_that_is_neither_is_refused_where_the_trace_is_read():
    with pytest.raises(ConfigError, match=r"rank0.trace.json: traceEvents\[0\] .*args.timing 'gpu' is not one of "
                                          r"cuda_event, host"):
        run_of([collective(1.0, 1.0, 1.0, timing="gpu")])

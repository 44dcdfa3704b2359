"""What one rank's entry of a DeepSpeed v0.3 list collective costs the host, in the units zsim prices it in.

`zero.implementation: deepspeed-0.5` charges each gathered or reduce-scattered tensor Nd narrows and Nd copy
launches at the GPU profile's `host_op_us` (10 µs, from the PyTorch profiler trace
../shared/data/kineto/dlrm-8xv100): 2 host ops per rank and tensor (zsim.zero.implementation). That trace
times an `aten::narrow` at 3 µs, but a profiler's op span leaves out the Python around the call. This
measures the Python, on this machine's CPU runtime:

  - DeepSpeed's per-rank loops, as written at v0.3.13 (partition_parameters.py): the gather's
    `partitions.append(flat.narrow(...))` with its `get_rank(group=...)` test, and the reduce-scatter's
    `grad.view(-1).narrow(...)` with its bounds arithmetic, each over a real gloo process group;
  - the same `aten::narrow` under torch.profiler, as the trace recorded it;

and converts: (loop iteration / recorded narrow) × the trace's median narrow is the loop's cost on the
trace's host. c10d's own per-rank work in a list collective (ProcessGroupNCCL.cpp, torch 1.8: an index
`select`, a `recordStream`, a `copy_` per view) is C++ with no Python around it, so it is taken from the
trace's medians directly. The sum, over `host_op_us`, is what the per-rank cost should be in host ops.

Run: .venv/bin/python benchmarks/list_loop_host.py      (~10 s; needs torch; the trace is read when
../shared/data is present, else its medians as docs/zero-implementations.md quotes them)
"""

from __future__ import annotations

import gzip
import json
import os
import statistics
import sys
import time
from pathlib import Path

TRACES = Path(__file__).resolve().parents[2] / "shared" / "data" / "kineto" / "dlrm-8xv100"
# The trace's medians (all 8 ranks), as read by trace_medians() when the data are present.
QUOTED = {"aten::narrow": 3.0, "aten::select": 3.0, "aten::record_stream": 2.0, "aten::copy_": 9.0}
HOST_OP_US = 10.0  # hwprofiles/gpus/v100-sxm3-32gb.yaml and a100-sxm4-80gb.yaml
ND = 1536  # GPT-175B on 1536 GPUs, the point whose per-rank costs matter most (zsim validate scale)


def trace_medians() -> tuple[dict[str, float], str]:
    """The median CPU µs of the ops in QUOTED across the trace's ranks, and where they came from."""
    if not TRACES.is_dir():
        return dict(QUOTED), "quoted (../shared/data absent)"
    durations: dict[str, list[float]] = {name: [] for name in QUOTED}
    for path in sorted(TRACES.glob("rank*.pt.trace.json.gz")):
        for e in json.loads(gzip.open(path).read())["traceEvents"]:
            if e.get("ph") == "X" and e.get("cat") == "cpu_op" and e.get("name") in durations:
                durations[e["name"]].append(float(e.get("dur", 0)))
    return {name: statistics.median(v) for name, v in durations.items()}, str(TRACES)


def main() -> int:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29541")
    dist.init_process_group("gloo", rank=0, world_size=1)
    group = dist.new_group([0])
    part = 1000
    flat = torch.zeros(ND * part)
    grad = torch.zeros(ND * part)
    numel = ND * part

    def gather_loop() -> list:  # partition_parameters.py @ v0.3.13 _allgather_param
        partitions = []
        for i in range(ND):
            partitions.append(flat.narrow(0, part * i, part))
            if i == torch.distributed.get_rank(group=group):
                pass  # the one local copy_ is priced apart
        return partitions

    def reduce_loop() -> list:  # partition_parameters.py @ v0.3.13 _reduce_scatter_gradient
        input_list = []
        for i in range(ND):
            start = i * part
            end = start + part
            if start < numel and end <= numel:
                tensor = grad.view(-1).narrow(0, start, part)
            input_list.append(tensor)
        return input_list

    def narrows() -> list:
        return [flat.narrow(0, part * i, part) for i in range(ND)]

    def per_iteration_us(f, reps: int = 30) -> float:
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            f()
            best = min(best, time.perf_counter() - t0)
        return best / ND * 1e6

    for f in (gather_loop, reduce_loop, narrows):
        f()
    gather_us, reduce_us = per_iteration_us(gather_loop), per_iteration_us(reduce_loop)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        narrows()
    recorded = statistics.median(e.cpu_time_total for e in prof.events() if e.name == "aten::narrow")
    dist.destroy_process_group()

    medians, source = trace_medians()
    c10d = medians["aten::select"] + medians["aten::record_stream"] + medians["aten::copy_"]
    print(f"this CPU (torch {torch.__version__}), Nd = {ND}: one loop iteration, best of 30")
    print(f"  gather loop (narrow, append, get_rank)   {gather_us:6.2f} us  = {gather_us / recorded:4.2f} x the recorded narrow")
    print(f"  reduce-scatter loop (view, narrow, ...)  {reduce_us:6.2f} us  = {reduce_us / recorded:4.2f} x the recorded narrow")
    print(f"  aten::narrow as torch.profiler records it {recorded:5.2f} us")
    print(f"the trace's medians ({source}):")
    print("  " + ", ".join(f"{k} {v:.1f} us" for k, v in medians.items()))
    print(f"per rank and tensor, on the trace's host (host_op_us = {HOST_OP_US:g} us):")
    for name, loop in (("gather", gather_us), ("reduce-scatter", reduce_us)):
        python = loop / recorded * medians["aten::narrow"]
        total = python + c10d
        print(f"  {name:15s} DeepSpeed's loop {python:5.1f} us + c10d's select, recordStream, copy_ {c10d:4.1f} us"
              f" = {total:5.1f} us = {total / HOST_OP_US:4.2f} host ops (zsim charges 2)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

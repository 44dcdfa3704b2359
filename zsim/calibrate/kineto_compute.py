"""GPU compute time of a runtime run from its Kineto traces (`zsim trace --torch-profiler`:
`rank<R>.kineto.json` beside `rank<R>.trace.json`): each compute op of the simulator's plan, rebuilt
from the run's metadata, is lined up with the zsim-labelled region of the same name, step and
occurrence (zsim.trace.kineto_ops), and measured by the GPU kernels that region launched itself
(NCCL kernels and the kernels of nested labelled ops excluded), not by the host span around it: the
host runs ahead of the GPU, so a host span times the launches, and with CUDA's asynchronous launches
a host span says little of what the GPU spent.

A trace without `ProfilerStep#N` spans is lined up by occurrence over the whole run (the profiler
recorded every step); with them, step N of the trace is training step N (the runtime calls
`profiler.step()` once per training step) and steps the profiler did not record are left out.
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from zsim.calibrate.collectives import CalibrationError
from zsim.trace.kineto_ops import LabelledTrace, labelled_ops

_KINETO_FILE = re.compile(r"^rank(\d+)\.kineto\.json(\.gz)?$")


def kineto_files(folder: Path) -> dict[int, Path]:
    """rank -> its Kineto file in a runtime trace folder (none: an empty mapping)."""
    if not folder.is_dir():
        return {}
    return {int(m.group(1)): p for p in sorted(folder.iterdir()) for m in [_KINETO_FILE.match(p.name)] if m}


def read_labelled(folder: Path) -> dict[int, LabelledTrace]:
    """The labelled ops of every rank's Kineto file in `folder`.

    Raises:
        ConfigError: a file that is not a readable trace (zsim.trace.json_file.load_json), or whose spans
        have no numeric times.
    """
    from zsim.trace.json_file import load_json
    from zsim.trace.kineto import _spans

    out = {}
    for rank, path in kineto_files(folder).items():
        out[rank] = labelled_ops(path, _spans(load_json(path), path))
    return out


def has_gpu_compute(traces: dict[int, LabelledTrace]) -> bool:
    """Whether the traces time any compute op on a GPU (a CPU run's Kineto traces hold no kernels)."""
    return any(op.is_compute and op.kernels for t in traces.values() for op in t.ops)


def gpu_aligned_ops(run: Any, traces: dict[int, LabelledTrace], profile: str,
                    profiles: Any = None) -> list[tuple[Any, float]]:
    """(plan op, measured GPU seconds) for every compute op of `run`'s plan rebuilt on `profile`: the
    median over ranks of the GPU time of the labelled op lined up with it (see the module docstring).
    The first step warms up (allocation, cuBLAS heuristics, first touch) and is left out.

    Raises:
        ConfigError: the run cannot be rebuilt on the profile.
        CalibrationError: plan ops in a recorded step that no rank's trace labels (the runtime and the
        simulator do not line up, or the traces lack the labels).
    """
    from zsim.calibrate.rebuild import rebuild
    from zsim.workload.transformer import build_workload
    from zsim.zero.plan import build_plan

    scenario = rebuild(run, profile, profiles)
    plan = build_plan(scenario, build_workload(scenario.model, scenario.parallel.mp, scenario.precision.dtype))
    stepped = all(t.steps for t in traces.values())
    recorded = set.intersection(*(set(t.steps) for t in traces.values())) if stepped else None
    index = [{(op.name, op.step, op.occurrence): op for op in t.ops if op.is_compute} for t in traces.values()]
    seen: dict[tuple[str, int | None], int] = defaultdict(int)
    rows, missing = [], []
    for op in plan.ops:
        if op.is_collective or op.transfer or op.memory_only:  # memory-only ops launch no kernel
            continue
        step = op.step if stepped else None
        key = (op.name, step, seen[(op.name, step)])
        seen[(op.name, step)] += 1
        if recorded is not None and op.step not in recorded:
            continue  # a step outside the profiler's window
        found = [ops[key].gpu_us() for ops in index if key in ops]
        if not found:
            missing.append(f"{op.name}@{op.step}.{op.micro_batch}")
            continue
        if op.step == 0:
            continue
        rows.append((op, float(np.median(found)) * 1e-6))
    if missing:
        raise CalibrationError(f"{run.folder}: {len(missing)} compute ops of the simulator's plan are not labelled in "
                               f"the Kineto traces ({', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}): "
                               "record them with the runtime's record_function labels, or calibrate from the host "
                               "spans (remove the rank<R>.kineto.json files)")
    return rows

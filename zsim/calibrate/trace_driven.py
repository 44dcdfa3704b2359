"""Trace-driven replay: the simulator keeps the measured compute durations and simulates only the
communication and memory (for network what-ifs on a real trace: what if the links were faster?).

Each compute op of the plan takes the median over ranks of the duration of the measured op with the
same (name, step, micro_batch, occurrence); an op the trace lacks is an error, not a silent
fallback to the compute model.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np

from zsim.calibrate.replay import is_collective, keyed
from zsim.errors import ConfigError
from zsim.trace.run_reader import MeasuredRun


def measured_durations(run: MeasuredRun) -> Callable[[list[Any]], dict[int, float]]:
    """A function of the plan's ops that gives {op index: measured seconds} for every compute op.

    Raises (when called):
        ConfigError: a compute op of the plan has no measured counterpart.
    """
    per_rank = [keyed(events) for events in run.events.values()]

    def durations(ops: list[Any]) -> dict[int, float]:
        seen: dict[tuple[str, int, int], int] = defaultdict(int)
        out, missing = {}, []
        for i, op in enumerate(ops):
            if op.is_collective or getattr(op, "transfer", "") or getattr(op, "memory_only", False):
                continue  # a memory-only op (the runtime mirror's) has no span: its time is the plan's, 0
            base = (op.name, op.step, op.micro_batch)
            key = (*base, seen[base])
            seen[base] += 1
            found = [r[key]["dur"] - r[key]["args"].get("nested_us", 0.0)  # own time, in-line ops excluded
                 for r in per_rank if key in r and not is_collective(r[key])]
            if not found:
                missing.append(f"{op.name}@{op.step}.{op.micro_batch}")
                continue
            out[i] = float(np.median(found)) * 1e-6
        if missing:
            raise ConfigError(f"--trace-driven: {len(missing)} compute ops of the rebuilt run have no measured "
                              f"counterpart ({', '.join(missing[:5])}{' ...' if len(missing) > 5 else ''})",
                              source=str(run.folder))
        return out

    return durations

"""Trace-driven replay of a Kineto trace (PyTorch profiler, NCCL job): the measured GPU kernels keep
their durations, the NCCL collectives are re-timed by the profile's collective model, and the ranks
are re-synchronised at every collective, for network what-ifs on a real job (e.g. the 8×V100 DLRM step).

The dependencies a Kineto trace does not record are inferred from its timing, as trace-driven
replays do (Chakra/PARAM's et_replay keep the order of each stream): every stream of a rank runs its
kernels in their measured order, keeping the measured idle gap before each kernel (host launch time);
a kernel that started within `_DEPENDENCY_US` of the end of a kernel on another stream of the same
rank is taken to wait for it (a stream wait after an event). A collective starts when its last
member is ready (NCCL's semantics: every member's kernel must be running) and lasts what the
profile's model says for its op, size and group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zsim.fabric.cluster import Cluster
from zsim.errors import ConfigError
from zsim.trace.kineto_run import KinetoRun
from zsim.trace.samples import CollectiveSample

_DEPENDENCY_US = 20.0  # a kernel launch after a stream wait lands within ~10 µs of the event (V100 trace: p90 8 µs)


@dataclass(slots=True)
class Kernel:
    rank: int
    stream: int
    name: str
    start: float  # measured, µs
    dur: float  # measured, µs (for a collective: the last member's kernel, i.e. the transfer)
    collective: int = -1  # index of the collective (k-th NCCL kernel), -1 for compute
    gap: float = 0.0  # measured idle time before it on its stream, after its dependencies
    after: int = -1  # index (in the rank's list) of a kernel on another stream it waits for
    new_start: float = 0.0
    new_end: float = 0.0


def _kernels(run: KinetoRun) -> list[list[Kernel]]:
    """Per rank, every GPU kernel (compute and NCCL) in measured order, with gaps and inferred waits."""
    out = []
    transfers = [max(members, key=lambda c: c.start_us).dur_us for members in run.matched()]
    index = {member: k for k, members in enumerate(run.members()) for member in members}
    origin = min([float(e["ts"]) for r in run.ranks for e in r.kernels + r.p2p] + [c.start_us for r in run.ranks
                                                                                   for c in r.collectives])
    for i, r in enumerate(run.ranks):
        # point-to-point NCCL kernels keep their measured time, as compute kernels do (no model re-times them)
        ks = [Kernel(r.rank, int(e.get("args", {}).get("stream", e.get("tid", 0))), str(e["name"]), float(e["ts"]),
                     float(e["dur"])) for e in r.kernels + r.p2p]
        nccl_stream = {}
        for pos, c in enumerate(r.collectives):
            k = index[(i, pos)]
            ks.append(Kernel(r.rank, -1 - c.stream, c.op, c.start_us, transfers[k], collective=k))  # its group's stream
            nccl_stream[k] = c
        ks.sort(key=lambda k: (k.start, k.collective))
        last_on: dict[int, int] = {}
        for i, k in enumerate(ks):
            prev = last_on.get(k.stream)
            prev_end = ks[prev].start + (ks[prev].dur if ks[prev].collective < 0 else
                                         nccl_stream[ks[prev].collective].dur_us) if prev is not None else None
            best, best_end = -1, None
            for j in range(i - 1, -1, -1):  # the latest kernel of another stream ending just before this one
                other = ks[j]
                end = other.start + (other.dur if other.collective < 0 else nccl_stream[other.collective].dur_us)
                if other.stream != k.stream and end <= k.start + 1e-9 and k.start - end <= _DEPENDENCY_US:
                    if best_end is None or end > best_end:
                        best, best_end = j, end
                if k.start - other.start > 100_000:
                    break
            k.after = best
            known = [x for x in (prev_end, best_end) if x is not None]
            ready = max(known) if known else origin  # a stream's first kernel: its offset from the trace's start
            k.gap = max(0.0, k.start - ready)
            last_on[k.stream] = i
        out.append(ks)
    return out


def replay_kineto(run: KinetoRun, cluster: Cluster | None) -> dict[str, Any]:
    """Re-time the run on `cluster` (None: keep the measured transfers, which must reproduce the
    measured span: the check of the inferred dependencies): measured and simulated span (first
    kernel start to last kernel end over all ranks), per-collective transfer times, the kernels.

    Raises:
        ConfigError: a collective the profile cannot place (group larger than the cluster).
    """
    from zsim.calibrate.nccl_fit import residuals_of

    per_rank = _kernels(run)
    matched = run.matched()
    samples = [CollectiveSample(m[0].op, m[0].nbytes, m[0].group, max(m, key=lambda c: c.start_us).dur_us * 1e-6,
                                "nccl", str(run.ranks[0].path.parent)) for m in matched]
    if cluster is None:
        simulated_us = [s.seconds * 1e6 for s in samples]
    else:
        simulated_us = [r.measured_busbw / r.simulated_busbw * s.seconds * 1e6 if r.simulated_busbw else 0.0
                        for r, s in zip(residuals_of(cluster, samples), samples)]
    ready: dict[int, dict[int, float]] = {k: {} for k in range(len(matched))}
    resolved: set[int] = set()
    position = [0] * len(per_rank)
    stream_end: list[dict[int, float]] = [dict() for _ in per_rank]
    while any(p < len(ks) for p, ks in zip(position, per_rank)):
        progressed = False
        for r, ks in enumerate(per_rank):
            while position[r] < len(ks):
                k = ks[position[r]]
                if k.collective in resolved:
                    position[r] += 1
                    progressed = True
                    continue
                t = max(stream_end[r].get(k.stream, 0.0), ks[k.after].new_end if k.after >= 0 else 0.0) + k.gap
                if k.collective < 0:
                    k.new_start, k.new_end = t, t + k.dur
                    stream_end[r][k.stream] = k.new_end
                    position[r] += 1
                    progressed = True
                    continue
                ready[k.collective].setdefault(r, t)
                if len(ready[k.collective]) < len(matched[k.collective]):
                    break  # wait for the other members
                start = max(ready[k.collective].values())  # NCCL: the transfer starts with the last member
                for rr, other in enumerate(per_rank):
                    for kk in other:
                        if kk.collective == k.collective:
                            kk.new_start, kk.new_end = start, start + simulated_us[k.collective]
                            stream_end[rr][kk.stream] = kk.new_end
                resolved.add(k.collective)
                progressed = True
        if not progressed:
            raise ConfigError("trace-driven replay cannot go on: some rank never reaches a collective the others "
                              "wait in (ranks recorded different windows?)", source=str(run.ranks[0].path.parent))
    first = min(k.start for ks in per_rank for k in ks)
    measured_span = max(k.start + (k.dur if k.collective < 0 else matched[k.collective][0].dur_us)
                        for ks in per_rank for k in ks) - first
    simulated_span = max(k.new_end for ks in per_rank for k in ks) - min(k.new_start for ks in per_rank for k in ks)
    return {"measured_span_s": measured_span * 1e-6, "simulated_span_s": simulated_span * 1e-6,
            "collectives": [{"op": s.op, "bytes": s.nbytes, "group": s.group, "measured_s": s.seconds,
                             "simulated_s": t * 1e-6} for s, t in zip(samples, simulated_us)],
            "kernels": per_rank}

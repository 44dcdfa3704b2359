"""`zsim calibrate` on a host (CPU) profile: runtime traces → the host's gloo collective terms and
compute terms (zsim.config.host), fitted by zsim.calibrate.host_fit, merged over the base profile's."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from zsim.calibrate.collectives import CalibrationError, check_backend
from zsim.calibrate.core_sharing import (collective_alone_us, comm_busy, compute_alone_us, compute_busy,
                                         gloo_speed_samples)
from zsim.calibrate.host_fit import fit_collectives, fit_compute, fit_optimizer
from zsim.calibrate.profile_writer import base_file
from zsim.calibrate.stragglers import slowest_rank_factor, step_ratios
from zsim.config.yamlfile import read_yaml_mapping
from zsim.trace.tracks import stream_of



def compute_keys(plan):
    """The plan's compute ops with the key a measured trace's events are found by (zsim.calibrate.replay.keyed):
    (name, step, micro-batch, k), k counting the ops of the same name in one micro-batch."""
    seen: dict[tuple[str, int, int], int] = defaultdict(int)
    for op in plan.ops:
        if op.is_collective or op.transfer or op.memory_only:  # memory-only ops have no measured span
            continue
        base = (op.name, op.step, op.micro_batch)
        yield op, (*base, seen[base])
        seen[base] += 1

def idle_before(events: list[dict[str, Any]]) -> dict[int, float]:
    """id(event) → µs the rank's compute track was idle just before that compute op (after the previous
    span of any kind, waiting included, ended): framework work between spans (Python bookkeeping,
    bucketing) that no span covers. The first op of a step counts none of the time between steps,
    which belongs to the harness, not to training (zsim.calibrate.replay.between_steps_us)."""
    track = sorted((e for e in events if e.get("ph") == "X" and stream_of(e) == 0), key=lambda e: e["ts"])
    out, end, step = {}, None, None
    for e in track:
        this = e.get("args", {}).get("step")
        if end is not None and not e["name"].startswith("wait"):
            out[id(e)] = max(0.0, e["ts"] - end) if this == step else 0.0
        end = max(end or 0.0, e["ts"] + e["dur"])
        step = this
    return out


def aligned_ops(run: Any, profile: str, profiles: Any = None,
                rank_steps: dict[tuple[int, int], float] | None = None, gloo: float | None = None
                ) -> list[tuple[Any, float]]:
    """(plan op, measured seconds) for every compute op of a measured (or simulated) run: each plan op
    of the run rebuilt on `profile`, with the median over ranks of the measured op lined up with it.
    An op's time is its own span (nested in-line ops excluded), less what it lost sharing a CPU host's
    cores with a collective (zsim.calibrate.core_sharing), plus, in a runtime trace, the compute
    track's idle time just before it: the simulator's ops run back to back, so the framework's time
    between spans must be priced by the ops (it lands in the per-op overhead) or every step comes out
    short. A runtime trace's first step warms up (allocation, first touch) and is left out; a simulated
    trace has no warm-up. `rank_steps`, when given, receives each rank's sum of these times per step
    after the first, keyed (step, rank), for slowest_rank_factor. `gloo`: the share of the cores a
    collective got beside compute (default: the profile's gloo_core_share).

    Raises:
        ConfigError: the run cannot be rebuilt on the profile.
        CalibrationError: compute ops of the plan that the trace lacks (the two do not line up).
    """
    from zsim.calibrate.rebuild import rebuild
    from zsim.calibrate.replay import is_collective, keyed
    from zsim.workload.transformer import build_workload
    from zsim.zero.plan import build_plan

    simulated = run.metadata.get("source") == "simulated"
    scenario = rebuild(run, profile, profiles)
    plan = build_plan(scenario, build_workload(scenario.model, scenario.parallel.mp, scenario.precision.dtype))
    per_rank = [keyed(events) for events in run.events.values()]
    gaps = [{} if simulated else idle_before(events) for events in run.events.values()]
    host = scenario.cluster.host  # a CPU host: take out the time compute shared the cores with gloo
    share, threads = (host.cores / max(1, scenario.layout.world), host.threads_per_rank) if host else (0.0, 0)
    gloo = gloo if gloo is not None else (host.gloo_share if host else 0.5)
    busy = [comm_busy(events) if host else [] for events in run.events.values()]
    rows, missing = [], []
    for op, key in compute_keys(plan):
        by_rank = {rank: r[key]["dur"] - r[key]["args"].get("nested_us", 0.0) + g.get(id(r[key]), 0.0)
                   - (compute_alone_us(r[key], c, share, threads, gloo) if host else 0.0)
                   for rank, (r, g, c) in enumerate(zip(per_rank, gaps, busy)) if key in r and not is_collective(r[key])}
        found = list(by_rank.values())
        if not found:
            missing.append(f"{op.name}@{op.step}.{op.micro_batch}")
            continue
        if op.step == 0 and not simulated:
            continue  # the first step warms up (allocation, first touch): not what a step costs
        if rank_steps is not None:
            for rank, us in by_rank.items():
                rank_steps[(op.step, rank)] = rank_steps.get((op.step, rank), 0.0) + us * 1e-6
        rows.append((op, float(np.median(found)) * 1e-6))
    if missing:
        raise CalibrationError(f"{run.folder}: {len(missing)} compute ops of the simulator's plan are not in the trace "
                               f"({', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}): the runtime and the "
                               "simulator do not line up for this configuration")
    return rows


def alone_samples(data: Any, profile: str, profiles: Any = None, gloo: float | None = None) -> list[Any]:
    """`data.collectives` with each runtime run's own collectives taken again without the time they
    shared the rank's cores with compute (zsim.calibrate.core_sharing), getting `gloo` of them (default:
    the profile's gloo_core_share); other samples as they are."""
    from zsim.calibrate.rebuild import rebuild
    from zsim.trace.run_samples import collective_samples

    runs = [run for run in data.runs if run.metadata.get("source") != "simulated"]
    folders = {str(run.folder) for run in runs}
    samples = [s for s in data.collectives if s.source not in folders]
    for run in runs:
        scenario = rebuild(run, profile, profiles)
        host = scenario.cluster.host
        share, threads = host.cores / max(1, scenario.layout.world), host.threads_per_rank
        g = host.gloo_share if gloo is None else gloo
        busy = {rank: compute_busy(events) for rank, events in run.events.items()}
        samples += collective_samples(run, shared_us=lambda rank, e, b=busy, c=share, t=threads, g=g:
                                      collective_alone_us(e, b[rank], c, t, g))
    return samples


def gloo_share_of(data: Any, profile: str, profiles: Any, lines: dict[tuple[str, int], tuple[float, float]]
                  ) -> tuple[float | None, int]:
    """(the share of a rank's cores gloo got while compute ran beside it, samples): the median over the
    runtime runs' collectives that compute overlapped for at least half their transfer of the speed they
    kept (zsim.calibrate.core_sharing.gloo_speed_samples, alone times from `lines`: (op, group size) ->
    (latency s, bytes/s), the probe's), as a share of the cores. None with fewer than 3 such collectives."""
    from zsim.calibrate.rebuild import rebuild
    from zsim.trace.run_samples import is_waiting

    shares: list[float] = []
    for run in (r for r in data.runs if r.metadata.get("source") != "simulated"):
        scenario = rebuild(run, profile, profiles)
        share = scenario.cluster.host.cores / max(1, scenario.layout.world)
        for events in run.events.values():
            busy = compute_busy(events)
            for e in events:
                args = e.get("args", {})
                if "op" not in args or not isinstance(args.get("group"), list) or is_waiting(e):
                    continue
                line = lines.get((args["op"], len(args["group"])))
                if line is None or not isinstance(args.get("bytes"), int):
                    continue
                speed = gloo_speed_samples(e, busy, (line[0] + args["bytes"] / line[1]) * 1e6)
                if speed is not None:
                    shares.append(speed * min(1.0, share) / share)  # speed = gloo·share / (alone: min(1, share))
    if len(shares) < 3:
        return None, len(shares)
    return float(np.clip(np.median(shares), 0.02, 0.98)), len(shares)


def plan_rows(run: Any, profile: str, profiles: Any = None, rank_steps: dict[tuple[int, int], float] | None = None,
              gloo: float | None = None) -> list[tuple[str, int, float, float, float]]:
    """(op name, kernel launches, FLOPs, streamed bytes, measured seconds) of every compute op of `run`
    (aligned_ops, with gloo's share of the cores `gloo`); an op without a kernel list counts as one launch."""
    return [(op.name, op.kernels.launches if op.kernels is not None else 1, op.flops, op.hbm_bytes, seconds)
            for op, seconds in aligned_ops(run, profile, profiles, rank_steps, gloo)]


def calibrate_host(cluster: Any, profile: str, data: Any, fit: str, replace: dict, sections: dict,
                   report: dict, profiles: Any = None, causes: list[str] | None = None) -> None:
    """Fit the host's collective and compute terms from `data` into `replace` (profile sections),
    `sections` (provenance) and `report`; the causes of a poor fit go to `causes`
    (zsim.calibrate.fit_quality: in-sample medians, terms more than 3x from the probe's, which the base
    host profile holds). A gloo line the data do not determine keeps the base's terms, listed under the
    collectives' `kept_from_base` with the reason.

    Raises:
        CalibrationError: non-gloo collectives, compute samples that are not runtime traces, or data
        that do not determine the compute terms.
    """
    from zsim.calibrate.fit_quality import far_terms, high_error

    causes = [] if causes is None else causes
    host = cluster.host
    gloo = host.gloo_share  # the base's, until the collectives say otherwise
    base = read_yaml_mapping(base_file(profile, profiles))
    if data.collectives and fit != "compute":
        check_backend(data.collectives, "gloo", profile)
        # how much of the cores a collective got beside compute: its overlapped transfers against the probe's
        # lines, which timed each collective with nothing beside it (not against lines fitted to these same
        # transfers: their latency would take up the slowdown, and the share drift back towards even)
        found, overlapped = gloo_share_of(data, profile, profiles, host.collectives)
        gloo = gloo if found is None else found
        fits, undetermined = fit_collectives(alone_samples(data, profile, profiles, gloo), host.collectives, profile)
        if overlapped >= 3:
            replace["gloo_core_share"] = round(gloo, 4)
        sections["core_sharing"] = report["core_sharing"] = {
            "gloo_core_share": round(gloo, 4), "collectives": overlapped,
            "how": "median speed of the collectives compute overlapped for at least half their transfer, against "
                   "the probe's lines"
            if overlapped >= 3 else f"the base's: {overlapped} collectives overlapped by compute (3 needed)"}
        merged = {op: dict(by_size) for op, by_size in (base.get("collectives") or {}).items()}
        summary = {}
        for (op, group), (line, sizes) in fits.items():
            entry = {"latency_us": round(line.intercept * 1e6, 3), "GBps": round(1.0 / line.slopes[0] / 1e9, 4),
                     "fit": {"median_rel_error": round(line.median_error, 4), "worst_rel_error": round(line.max_error, 4),
                             "points": sizes}}
            merged.setdefault(op, {})[group] = entry
            summary[f"{op}/{group}"] = {**entry, "latency": "kept from the base (too few sizes)"
                                        if line.intercept_kept else "fitted"}
            causes += high_error(f"gloo {op}/{group}", line.median_error)
            probe = host.collectives.get((op, group))
            if probe is not None:
                fitted = {"GBps": entry["GBps"], **({} if line.intercept_kept else {"latency_us": entry["latency_us"]})}
                causes += far_terms(f"gloo {op}/{group}", fitted, {"latency_us": probe[0] * 1e6, "GBps": probe[1] / 1e9},
                                    "the probe")
        kept = {f"{op}/{group}": why + ("; the base's terms kept" if (op, group) in host.collectives
                                        else "; the base has none: not in the profile")
                for (op, group), why in undetermined.items()}
        if fits:
            replace["collectives"] = merged
        sections["collectives"] = {"model": "gloo latency-bandwidth", "fitted": summary, "kept_from_base": kept}
        report["collectives"] = sections["collectives"]
    if fit == "collectives":
        return
    if any(s.kind == "gemm" for s in data.compute) or (data.compute and not data.runs):
        raise CalibrationError("compute samples other than runtime traces (GEMM tables?) cannot calibrate a host "
                               "profile: its compute terms are fitted from the runtime's own ops")
    if data.runs:
        rows, ratios = [], []
        for run in data.runs:
            rank_steps: dict[tuple[int, int], float] = {}
            rows += plan_rows(run, profile, profiles, rank_steps, gloo)
            if run.metadata.get("source") != "simulated":
                ratios += step_ratios(rank_steps)
        model = [r[1:] for r in rows if not r[0].startswith("optimizer/")]
        dtypes = {str(run.metadata.get("precision", "fp32")) for run in data.runs}
        if len(dtypes) > 1:
            raise CalibrationError(f"runs of different precisions ({', '.join(sorted(dtypes))}) share one matmul rate "
                                   "in this fit: calibrate each precision separately")
        dtype = dtypes.pop()
        probe = base.get("compute") or {}  # the base's terms, which the host probe measured: kept where undetermined
        kept_why: dict[str, str] = {}
        line, kept_terms = fit_compute(model, float(probe.get("memory_GBps") or 0) * 1e9 or None,
                                       float(probe.get("op_overhead_us") or 0) * 1e-6 or None,
                                       float((probe.get("matmul_GFLOPS") or {}).get(dtype) or 0) * 1e9 or None,
                                       hold_overhead=True, reasons=kept_why)
        compute = dict(base.get("compute") or {})
        compute["matmul_GFLOPS"] = {**(compute.get("matmul_GFLOPS") or {}),
                                    dtype: round(1.0 / line.slopes[1] / 1e9, 3)}
        compute["memory_GBps"] = round(1.0 / line.slopes[2] / 1e9, 3)
        compute["op_overhead_us"] = round(line.slopes[0] * 1e6, 3)
        compute["module_overhead_us"] = round(line.intercept * 1e6, 3)
        optimizer = [(r[1], r[3], r[4]) for r in rows if r[0].startswith("optimizer/")]
        opt = fit_optimizer(optimizer) if optimizer else None
        if opt is not None:
            compute["optimizer_op_overhead_us"] = round(opt.slopes[0] * 1e6, 3)
            compute["optimizer_memory_GBps"] = round(1.0 / opt.slopes[1] / 1e9, 3)
        factor = slowest_rank_factor(ratios)
        compute["slowest_rank_factor"] = round(factor, 4) if factor is not None else 1.0
        replace["compute"] = compute
        sections["compute"] = {"model": "host: per op (module) + launches × overhead (the probe's) + FLOPs/matmul rate + "
                                        "bytes/memory bandwidth; "
                                        "the optimizer's ops: launches × their overhead + bytes/their bandwidth",
                               "ops": len(model), "optimizer_ops": len(optimizer), "dtype": dtype,
                               "kept_from_base": list(kept_terms), "kept_why": kept_why,
                               "median_error": round(line.median_error, 4), "max_error": round(line.max_error, 4),
                               "optimizer_median_error": None if opt is None else round(opt.median_error, 4),
                               "slowest_rank_factor": {"steps": len(ratios), "value": compute["slowest_rank_factor"],
                                                       "how": "median of max/mean rank compute per step"
                                                       if factor is not None else "1: fewer than 3 steps of two or "
                                                       "more measured ranks (one rank, or simulated traces only)"}}
        causes += high_error("host compute", line.median_error)
        causes += high_error("host optimizer", None if opt is None else opt.median_error)
        fitted = {k: v for k, v in ((f"matmul_GFLOPS.{dtype}", compute["matmul_GFLOPS"][dtype]),
                                    ("op_overhead_us", compute["op_overhead_us"]), ("memory_GBps", compute["memory_GBps"]))
                  if k.split(".")[0] not in kept_terms}
        reference = {f"matmul_GFLOPS.{dtype}": (probe.get("matmul_GFLOPS") or {}).get(dtype),
                     "op_overhead_us": probe.get("op_overhead_us"), "memory_GBps": probe.get("memory_GBps")}
        if opt is not None:  # the optimizer's own terms, against the base's (the general ones where it has none)
            fitted.update(optimizer_op_overhead_us=compute["optimizer_op_overhead_us"],
                          optimizer_memory_GBps=compute["optimizer_memory_GBps"])
            reference.update(optimizer_op_overhead_us=probe.get("optimizer_op_overhead_us", probe.get("op_overhead_us")),
                             optimizer_memory_GBps=probe.get("optimizer_memory_GBps", probe.get("memory_GBps")))
        causes += far_terms("host compute", fitted, reference, "the probe")
        report["compute"] = {**sections["compute"], "values": {k: compute[k] for k in (
            "matmul_GFLOPS", "memory_GBps", "op_overhead_us", "module_overhead_us", "optimizer_op_overhead_us",
            "optimizer_memory_GBps", "slowest_rank_factor")
            if k in compute}}

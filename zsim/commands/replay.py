"""`zsim replay TRACE_DIR --profile P`: simulate a measured run and compare it with what was measured,
op by op: step time, per op kind, exposed communication, peak memory; one Perfetto file with both."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zsim.commands import HELP
from zsim.commands.options import add_json_option, add_profile_options, emit_json, printable_text, profile_search
from zsim.errors import EXIT_OK
from zsim.report.table import format_table

if TYPE_CHECKING:
    from zsim.config.profiles import Profiles


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "replay", help=HELP["replay"],
        description="Rebuild a measured run (runtime traces) from its metadata, simulate it on a profile, line up "
                    "every op, and print predicted against measured: step time, per op kind (median and spread), "
                    "exposed communication, peak memory per category, each with its error. Writes one Perfetto "
                    "trace with the measured ranks and the simulated run side by side.")
    p.add_argument("trace_dir", type=Path, help="folder of rank<R>.trace.json files (zsim trace -o), or of one "
                   "Kineto trace per rank (with --trace-driven)")
    add_profile_options(p, required=True, what="the hardware profile to simulate on (e.g. the output of zsim calibrate)")
    add_json_option(p, "the report")
    p.add_argument("-o", "--output", type=Path, metavar="DIR",
                   help="where replay.trace.json goes (default out/replay-<trace folder name>)")
    p.add_argument("--trace-driven", action="store_true",
                   help="keep the measured compute durations; simulate only communication and memory")
    p.set_defaults(func=run_command)


def replay(trace_dir: Path, profile: str, trace_driven: bool = False,
           profiles: Profiles | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(report, side-by-side trace document) of the run in `trace_dir` simulated on `profile` (a name found
    by `profiles`, default $ZSIM_PROFILE_PATH then the built-in ones, or a .yaml file).

    Raises:
        ConfigError: the traces are damaged or mixed, or the run cannot be rebuilt on the profile.
    """
    import numpy as np

    from zsim.calibrate import replay as rp
    from zsim.calibrate.rebuild import rebuild
    from zsim.engine.simulation import simulate
    from zsim.trace.run_reader import read_run

    run = read_run(trace_dir)
    scenario = rebuild(run, profile, profiles)
    if trace_driven:
        from zsim.calibrate.trace_driven import measured_durations

        result = simulate(scenario, compute_override=measured_durations(run))
    else:
        result = simulate(scenario)
    simulated = result.events
    measured = {r: rp.on_common_clock(ev + run.counters[r], run.offsets_us[r]) for r, ev in run.events.items()}
    alignment = rp.align(run.events[0], simulated)
    kinds = rp.kind_table(run.events, simulated, alignment)
    m_steps = rp.slowest_step_seconds(measured)
    s_steps = list(result.step_seconds)
    m_exposed = [rp.exposed_comm_seconds(run.events[0]).get(k, 0.0) for k in range(len(m_steps))]
    s_exposed = [rp.exposed_comm_seconds(simulated).get(k, 0.0) for k in range(len(s_steps))]
    m_peak = rp.peak_memory(run.counters[0])
    s_peak = rp.peak_memory(simulated)
    states_measured = {k: v["bytes"] for k, v in (run.metadata.get("model_states") or {}).items()}
    states_simulated = {"params": result.model_states.params, "grads": result.model_states.grads,
                        "optimizer": result.model_states.optimizer}

    def pair(measured_value: float, simulated_value: float) -> dict[str, float]:
        error = simulated_value / measured_value - 1.0 if measured_value else (0.0 if not simulated_value else None)
        return {"measured": measured_value, "simulated": simulated_value, "error": error}

    judged_m, judged_s = rp.judged(m_steps), rp.judged(s_steps)
    backend = run.metadata.get("backend")
    host_profile = getattr(scenario.cluster, "host", None) is not None  # a CPU host: gloo; else a GPU system: NCCL
    caution = None
    if backend in ("gloo", "nccl") and (backend == "gloo") != host_profile:
        # zsim calibrate refuses this pairing (zsim.calibrate.collectives.check_backend); a replay may be
        # a deliberate what-if, so it runs, and says what it compares
        caution = (f"the run's collectives ran on {backend}, the profile models "
                   f"{'gloo on a CPU host' if host_profile else 'NCCL on GPUs'}: the errors below compare two "
                   "different machines, not the simulator with this run")
    note = getattr(scenario.cluster, "calibration", None)
    if note is not None and note.warning:  # a poor fit written with --accept-poor-fit (zsim.calibrate.fit_quality)
        caution = "; ".join(filter(None, [caution, "the profile is a poor fit, written with --accept-poor-fit: "
                                          + "; ".join(note.warning)]))
    report = {
        "trace_dir": str(trace_dir), "profile": profile, "trace_driven": trace_driven,
        "run": {"world_size": run.world_size, "stage": run.metadata["zero"].get("stage"), "dp": run.metadata["dp"],
                "mp": run.metadata["mp"], "precision": run.metadata["precision"],
                "grad_accum": scenario.grad_accum, "steps": len(m_steps), "backend": run.metadata.get("backend")},
        "step_seconds": {**pair(float(np.median(judged_m)), float(np.median(judged_s))),
                         "measured_per_step": m_steps, "simulated_per_step": s_steps,
                         "judged_steps": list(range(len(m_steps)))[-len(judged_m):]},
        "exposed_comm_seconds": pair(float(np.median(rp.judged(m_exposed))), float(np.median(rp.judged(s_exposed)))),
        "kinds": [{"kind": k.kind, "count": k.count, **pair(k.measured_s, k.simulated_s),
                   "spread": list(k.spread)} for k in kinds],
        "peak_memory_bytes": {c: pair(m_peak.get(c, 0), s_peak.get(c, 0)) for c in sorted(set(m_peak) | set(s_peak),
                                                                                          key=_category_order)},
        "model_states_bytes": {c: {**pair(states_measured.get(c, 0), v), "exact": states_measured.get(c) == v}
                               for c, v in states_simulated.items()},
        "caution": caution,
        "alignment": {"lined_up": len(alignment.pairs),
                      "measured_only": [list(k) for k in alignment.measured_only],
                      "simulated_only": [list(k) for k in alignment.simulated_only],
                      "bytes_differ": [[list(k), m, s] for k, m, s in alignment.bytes_differ]},
    }
    return report, side_by_side(measured, simulated, f"simulated on {profile}")


def _category_order(name: str) -> int:
    from zsim.trace.schema import CATEGORIES

    return CATEGORIES.index(name) if name in CATEGORIES else len(CATEGORIES)


def side_by_side(measured: dict[int, list[dict[str, Any]]], simulated: list[dict[str, Any]], label: str) -> dict:
    """One Perfetto document: measured rank r as process r, the simulated run as process 1000, both
    starting at 0 (the first op of each)."""
    from zsim.trace import schema

    events: list[dict[str, Any]] = []
    starts = [e["ts"] for evs in measured.values() for e in evs if e.get("ph") == "X"]
    t0 = min(starts) if starts else 0.0
    for rank, evs in sorted(measured.items()):
        events += schema.process_meta(rank, f"measured rank {rank}")
        events += [{**e, "pid": rank, "ts": e["ts"] - t0} for e in evs if e.get("ph") in ("X", "C")]
    s0 = min((e["ts"] for e in simulated if e.get("ph") == "X"), default=0.0)
    events += schema.process_meta(1000, label)
    events += [{**e, "pid": 1000, "ts": e["ts"] - s0} for e in simulated if e.get("ph") in ("X", "C")]
    return schema.document(events, {"source": "replay", "processes": {"0..": "measured ranks", "1000": label}})


def print_report(report: dict[str, Any], out) -> None:
    r = report["run"]
    print(f"zsim replay · {report['trace_dir']} ({r['world_size']} ranks {r['backend']}, ZeRO stage {r['stage']}, "
          f"dp {r['dp']} × mp {r['mp']}, {r['precision']}, grad-accum {r['grad_accum']}, {r['steps']} steps) on "
          f"{report['profile']}{' (trace-driven compute)' if report['trace_driven'] else ''}", file=out)
    if report.get("caution"):
        print(f"  caution   {report['caution']}", file=out)

    def row(label: str, p: dict[str, Any], unit: str = "ms", scale: float = 1e3, count: str = "",
            spread: str = "") -> list[str]:
        return [label, count, _number(p["measured"], scale, ".3f"), _number(p["simulated"], scale, ".3f"), unit,
                _number(p["error"], 1, "+.1%"), spread]

    steps = report["step_seconds"]["judged_steps"]
    rows = [row(f"step time (median, steps {steps[0]}-{steps[-1]})", report["step_seconds"]),
            row("exposed comm per step", report["exposed_comm_seconds"])]
    for k in report["kinds"]:
        lo, hi = k["spread"]
        rows.append(row(f"op {k['kind']}", k, count=f"{k['count']} ops",
                        spread=f"[{_number(lo, 1, '+.0%')}, {_number(hi, 1, '+.0%')}]"))
    rows += [row(f"peak {c}", p, "MB", 1e-6) for c, p in report["peak_memory_bytes"].items()]
    print("  op: median per op of a kind, spread = its 10th..90th percentile of per-op error; "
          "peak: memory per category, rank 0 (MB = 1e6 B)", file=out)
    for text in format_table(rows, header=[["", "", "measured", "simulated", "", "error", "spread"]], align="<>>><>>"):
        print(text, file=out)
    exact = all(v["exact"] for v in report["model_states_bytes"].values())
    states = ", ".join(f"{c} {v['measured']:,} / {v['simulated']:,}" for c, v in report["model_states_bytes"].items())
    print(f"  model states per rank, B   {'exact' if exact else 'DIFFER'}: {states}", file=out)
    a = report["alignment"]
    print(f"  ops lined up {a['lined_up']}; measured only {len(a['measured_only'])}, simulated only "
          f"{len(a['simulated_only'])}, bytes differ {len(a['bytes_differ'])}", file=out)
    for label, keys in (("measured only", a["measured_only"]), ("simulated only", a["simulated_only"])):
        if keys:
            shown = ", ".join(f"{k[0]}@{k[1]}.{k[2]}" for k in keys[:6])
            print(f"    {label}: {shown}{' ...' if len(keys) > 6 else ''}", file=out)


def _number(value: float | None, scale: float, spec: str) -> str:
    """`value × scale` formatted by `spec`, or '-' when there is none (zsim.report.table pads it)."""
    return "-" if value is None else format(value * scale, spec)


def replay_kineto_dir(trace_dir: Path, profile: str, allow_missing_ranks: bool = False,
                      profiles: Profiles | None = None) -> tuple[dict, dict]:
    """(report, side-by-side document) of a Kineto trace re-timed on `profile` (trace-driven only).

    Raises:
        ConfigError: the traces are damaged, or the job does not fit the profile's nodes.
    """
    import math

    from zsim.calibrate.kineto_replay import replay_kineto
    from zsim.fabric.cluster import load_cluster
    from zsim.config.profiles import Profiles
    from zsim.trace import schema
    from zsim.trace.kineto_run import read_kineto

    profiles, name = (Profiles.from_environment() if profiles is None else profiles).resolve_system(profile)
    run = read_kineto([trace_dir], allow_missing_ranks)
    per_node = load_cluster(name, 1, profiles).gpus_per_node
    cluster = load_cluster(name, max(1, math.ceil(run.world_size / per_node)), profiles)
    result = replay_kineto(run, cluster)
    identity = replay_kineto(run, None)
    m, s = result["measured_span_s"], result["simulated_span_s"]
    report = {"trace_dir": str(trace_dir), "profile": profile, "trace_driven": True, "format": "kineto",
              "run": {"world_size": run.world_size, "backend": run.ranks[0].backend, "device": run.ranks[0].device},
              "span_seconds": {"measured": m, "simulated": s, "error": s / m - 1.0},
              "span_with_measured_transfers_seconds": identity["simulated_span_s"],
              "collectives": result["collectives"]}
    events: list[dict[str, Any]] = []
    first = min(k.start for ks in result["kernels"] for k in ks)
    for rank, ks in enumerate(result["kernels"]):
        for pid, label, start_of in ((rank, f"measured rank {rank}", lambda k: k.start - first),
                                     (1000 + rank, f"simulated rank {rank} on {profile}", lambda k: k.new_start)):
            events += schema.process_meta(pid, label)
            events += [{"ph": "X", "name": k.name, "pid": pid, "tid": 1 if k.collective >= 0 else 0,
                        "ts": start_of(k), "dur": k.dur if pid < 1000 else k.new_end - k.new_start,
                        "cat": "comm" if k.collective >= 0 else "compute", "args": {"stream": k.stream}}
                       for k in ks]
    return report, schema.document(events, {"source": "replay", "format": "kineto"})


def print_kineto_report(report: dict[str, Any], out) -> None:
    r, span = report["run"], report["span_seconds"]
    print(f"zsim replay · {report['trace_dir']} (Kineto, {r['world_size']} ranks {r['backend']} on {r['device']}) "
          f"re-timed on {report['profile']}: measured compute, simulated collectives", file=out)
    print(f"  GPU span of the trace      measured {span['measured'] * 1e3:.3f} ms, simulated {span['simulated'] * 1e3:.3f} ms "
          f"({span['error']:+.1%}); with the measured transfers {report['span_with_measured_transfers_seconds'] * 1e3:.3f} ms",
          file=out)
    rows = [[c["op"], str(c["bytes"]), str(c["group"]), f"{c['measured_s'] * 1e6:.1f}", f"{c['simulated_s'] * 1e6:.1f}"]
            for c in report["collectives"]]
    for text in format_table(rows, header=[["collective", "bytes", "n", "measured", "simulated"], ["", "", "", "µs", "µs"]]):
        print(text, file=out)


def run_command(args: argparse.Namespace) -> int:
    from zsim.errors import ConfigError
    from zsim.calibrate.inputs import kind_of

    from zsim.report.outputs import check_dir, check_file, write_atomic

    profiles, _ = profile_search(args)  # checks --profiles and that --profile was given
    out_dir = check_dir(args.output or Path("out") / f"replay-{args.trace_dir.resolve().name}")
    if args.json and args.json != "-":
        check_file(args.json)  # before any work: a bad output costs nothing
    kind = kind_of(args.trace_dir)
    if kind == "kineto":
        if not args.trace_driven:
            raise ConfigError("a Kineto trace has no model to rebuild: replay it with --trace-driven (measured "
                              "compute, simulated collectives)", source=str(args.trace_dir))
        report, document = replay_kineto_dir(args.trace_dir, args.profile, profiles=profiles)
        printer = print_kineto_report
    elif kind == "runtime":
        report, document = replay(args.trace_dir, args.profile, args.trace_driven, profiles=profiles)
        printer = print_report
    else:
        raise ConfigError(f"replay needs runtime traces (rank<R>.trace.json) or Kineto traces, not {kind} input",
                          source=str(args.trace_dir))
    out_dir.mkdir(parents=True, exist_ok=True)
    path = write_atomic(out_dir / "replay.trace.json", json.dumps(document, separators=(",", ":")))
    report["outputs"] = {"trace": str(path)}
    text = printable_text(args)  # event names and paths come from the traces: no escape sequence reaches the terminal
    printer(report, text)
    print(f"  outputs     {path} (measured and simulated side by side: https://ui.perfetto.dev)", file=text)
    emit_json(args, report, indent=1)
    return EXIT_OK

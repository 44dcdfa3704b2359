"""`zsim run SCENARIO`: simulate a scenario and report fit, speed, memory and communication."""

from __future__ import annotations

import argparse
import json
import sys
import time

from zsim.commands import HELP
from zsim.commands.options import add_json_option, add_profile_options, emit_json, profile_search, text_stream
from zsim.errors import EXIT_OK, EXIT_OOM

SHOW_PROGRESS_S = 2.0  # a run estimated shorter than this gets no bar (zsim.zero.cost.estimate)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "run", help=HELP["run"],
        description="Simulate a scenario's training steps; print a summary and write result.json, trace.json "
                    "(Perfetto), memory.csv, memory.png and timeline.png to the output folder. Exit 0 if it fits, 3 on "
                    "OOM, 2 on bad input.")
    p.add_argument("scenario", help="scenario YAML file, or a shipped scenario's name (zsim profiles lists them), "
                   "e.g. 1T-1024gpu")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario key, e.g. --set zero.stage=2 (repeatable)")
    add_json_option(p, "the result facts")
    p.add_argument("-o", "--output", metavar="DIR", help="output folder (default: run.output or out/<name>)")
    p.add_argument("--plot", choices=("background", "wait", "none"), default="background",
                   help="memory.png and timeline.png: drawn by a background process after the summary (default; "
                        "the command returns at once), drawn before returning (wait), or not at all (none)")
    p.add_argument("--no-plot", dest="plot", action="store_const", const="none", help="the same as --plot none")
    p.add_argument("--stats", action="store_true", help="print simulation statistics: events, wall time, events/s")
    add_profile_options(p, what="run on this hardware profile instead of the scenario's hardware.profile")
    p.set_defaults(func=run_command)


def run_command(args: argparse.Namespace) -> int:
    from zsim.console.signals import sigint_held

    # Ctrl-C while C extensions initialise (libyaml, numpy) aborts the interpreter or surfaces
    # as "ImportError: initialization failed" instead of exiting 130: hold it until loading is done.
    with sigint_held():
        from zsim.scenario.scenario import load_scenario
        from zsim.engine.simulation import simulate
        from zsim.memory.timeline import write_csv
        from zsim.report.facts import facts
        from zsim.report.outputs import OutputSet, check_dir, check_file
        from zsim.report.plots import memory_png_later, memory_timeline_png
        from zsim.report.summary import summary
        from zsim.report.trace_writer import write_trace
        from zsim.zero.cost import check_cost

        started = time.perf_counter()
        profiles, name = profile_search(args)
        overrides = [*args.overrides, *([f"hardware.profile={name}"] if name else [])]
        scenario = load_scenario(args.scenario, args.overrides, profiles=profiles, profile=name)
        out = check_dir(args.output if args.output is not None else scenario.output_dir,
                        flag="-o" if args.output is not None else "run.output")  # before simulating: a bad -o costs nothing
        if args.json is not None and args.json != "-":
            check_file(args.json)
        cost = check_cost(scenario)  # refuses what would not fit this machine or take too long
        if args.plot == "wait":  # the plots' libraries (numpy, matplotlib) initialise C extensions too
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot  # noqa: F401

    # one progress display, tqdm's, on a terminal and for work estimated at SHOW_PROGRESS_S or more
    result = simulate(scenario, progress=sys.stderr.isatty() and cost.seconds >= SHOW_PROGRESS_S)
    f = facts(result)
    f["scenario"]["overrides"] = overrides  # what the command line changed (the description is the file's)
    names = {"result": "result.json", "trace": "trace.json", "memory_csv": "memory.csv"}
    if args.plot != "none":
        names.update(memory="memory.png", timeline="timeline.png")
    f["outputs"] = outputs = {key: str(out / name) for key, name in names.items()}
    with OutputSet(out) as files:  # every file to a temporary name; all renamed into place together
        files.write("trace.json", lambda p: write_trace(result, p))
        files.write("memory.csv", lambda p: write_csv(result.ledger, p))
        if args.plot == "wait":
            from zsim.report.timeline_plot import timeline_png

            files.write("memory.png", lambda p: memory_timeline_png(result, p))
            files.write("timeline.png", lambda p: timeline_png(result, p))
        files.text("result.json", json.dumps(f, indent=2, allow_nan=False) + "\n")
        files.commit()
    try:
        stream = text_stream(args)
        print(summary(f, outputs), file=stream)
        if args.stats:
            wall = time.perf_counter() - started
            sim = result.wall_seconds
            print(f"  stats     {result.sim_events:,} simpy events in {sim:.3f} s of simulation "
                  f"({result.sim_events / max(sim, 1e-9):,.0f} events/s); {len(result.events):,} trace events; "
                  f"{wall:.3f} s in all (load, simulate, write)", file=stream)
        emit_json(args, f)
    finally:
        # Drawn from the committed files by a detached process, started last: on a machine of few
        # cores it would otherwise compete with this command's own last steps for a core.
        if args.plot == "background":
            memory_png_later(out)
    if not result.fits:
        oom = result.ledger.oom
        where = f"rank class 0 (all {scenario.layout.world} ranks)" if result.pipeline is None else \
            f"pipeline stage {result.pipeline['worst_stage']} (ranks " \
            f"{result.pipeline['per_stage'][result.pipeline['worst_stage']]['ranks']})"
        print(f"zsim: out of memory at t = {oom.time_s:.3f} s on {where}: "
              f"{oom.category} ({oom.tag}, {oom.nbytes / 1e9:.2f} GB) needed {oom.reserved_bytes / 1e9:.2f} GB reserved "
              f"> {oom.capacity_bytes / 1e9:.2f} GB ({oom.total_bytes / 1e9:.2f} GB allocated)", file=sys.stderr)
        return EXIT_OOM
    return EXIT_OK


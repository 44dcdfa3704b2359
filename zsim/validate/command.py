"""`zsim validate SUITE`: run a validation suite (zsim.validate.SUITES) and print simulated against
published or measured, per point, with pass/fail against each criterion. Exit 0 when everything passes,
1 when anything fails, 2 on bad input (docs/validation.md, docs/calibrate.md)."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from zsim.commands import HELP
from zsim.commands.options import add_json_option, emit_json, text_stream
from zsim.errors import ZsimError
from zsim.validate import SUITES

EXIT_FAILED = 1


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "validate", help=HELP["validate"],
        description="Run a validation suite and print, per point, the simulated and the published or measured "
                    "value, the error and pass/fail against the point's tolerance. Suites: "
                    + ", ".join(SUITES) + " (paper: the ZeRO paper's evaluation; megatron: Megatron-LM 2019's "
                    "published V100 scaling, out of sample; both in docs/validation.md; scale: published multi-node "
                    "runs, judged on their held-out half, and modern: published runs with pipeline and sequence parallelism, "
                    "judged the same way, docs/validation.md; replay: record real runs, "
                    "calibrate on some, replay the others, docs/calibrate.md). Exit 0 if all pass, 1 if any fails, "
                    "2 on bad input.")
    p.add_argument("suite", choices=sorted(SUITES), help="which suite")
    p.add_argument("--suite-file", type=Path, default=None,
                   help="replay, scale, modern: the suite YAML (default zsim/validate/suites/replay-cpu.yaml, "
                        "scale.yaml, modern.yaml)")
    p.add_argument("-o", "--output", type=Path, default=None, metavar="DIR",
                   help="replay: where the recorded traces and the calibrated profile go (default out/validate-replay)")
    p.add_argument("--png", type=Path, default=None, metavar="PATH",
                   help="also draw the points as a chart: each one's error against its tolerance")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="paper, megatron, scale, modern: override a scenario key in every run of the suite, as "
                        "zsim run --set does (repeatable), e.g. --set zero.overlap_comm=true; the report names them")
    p.add_argument("--point", dest="only", action="append", default=[], metavar="ID",
                   help="scale, modern: run only the points whose id matches (a shell-style pattern, repeatable), "
                        "e.g. --point 'mlperf31-*'; series whose points are all chosen are checked; the report says it "
                        "is a subset, not the suite's verdict")
    p.add_argument("--dry-run", action="store_true",
                   help="replay: check the suite (its file, base profile and every run's model) and list what it "
                        "would record, without recording (seconds; needs no torch)")
    add_json_option(p, "the report")
    p.set_defaults(func=run_command)


def run_command(args: argparse.Namespace) -> int:
    from zsim.report.outputs import check_dir, check_file

    if args.json and args.json != "-":
        check_file(args.json)  # before the suite runs (minutes): a bad output costs nothing
    if args.png is not None:
        check_file(args.png, flag="--png")
        if args.png.suffix.lower() != ".png":
            raise ZsimError(f"--png {args.png}: expected a .png file name (the chart is a PNG)")
    if args.output is not None:
        check_dir(args.output)
    if args.only and args.suite not in ("scale", "modern"):
        raise ZsimError(f"--point applies to the scale and modern suites, whose points have ids; the {args.suite} "
                        "suite runs as a whole")
    if args.suite == "replay":
        if args.overrides:
            raise ZsimError("--set applies to the paper, megatron, scale and modern suites; replay records its own runs "
                            "(give it a --suite-file instead)")
        options = {"suite_file": args.suite_file, "output": args.output, "dry_run": args.dry_run}
    elif args.suite in ("scale", "modern"):
        if args.dry_run:
            raise ZsimError(f"--dry-run applies to the replay suite; the {args.suite} suite only simulates: run it")
        if args.output is not None:
            raise ZsimError(f"--output does not apply to the {args.suite} suite: it only simulates (write the "
                            "report with --json)")
        if args.suite_file is not None and not args.suite_file.is_file():
            raise ZsimError(f"--suite-file {args.suite_file}: no such file")
        options = {"suite_file": args.suite_file, "overrides": tuple(args.overrides), "only": tuple(args.only)}
    else:
        if args.dry_run:
            raise ZsimError(f"--dry-run applies to the replay suite; the {args.suite} suite only simulates "
                            "(seconds): run it")
        if args.suite_file is not None:
            raise ZsimError(f"--suite-file applies to the replay, scale and modern suites; the {args.suite} suite is its scenarios "
                            "(change them with --set)")
        options = {"overrides": tuple(args.overrides)}
    report = importlib.import_module(SUITES[args.suite]).run(progress=sys.stderr.isatty(), **options)
    print(report.table(), file=text_stream(args))
    emit_json(args, report.as_dict(), indent=1)
    if args.png is not None:
        from zsim.validate.chart import report_png

        print(f"chart: {report_png(report, args.png)}", file=sys.stderr)
    return 0 if report.passed else EXIT_FAILED

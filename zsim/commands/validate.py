"""`zsim validate SUITE`: run a validation suite (zsim.validate.SUITES) and print simulated against
published, per point, with pass/fail against each tolerance. Exit 0 when every point and check passes,
1 when any fails (docs/validation.md)."""

from __future__ import annotations

import argparse
import importlib
import sys

from zsim.commands.options import add_json_option, emit_json, text_stream
from zsim.validate import SUITES

EXIT_FAILED = 1


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "validate", help="compare simulations with published results (exit 1 if any point fails)",
        description="Run a validation suite and print, per point, the simulated and published value, the error, "
                    "whether the run fits in memory, and pass/fail against the point's tolerance. Suites: "
                    + ", ".join(SUITES) + ". Exit 0 if all pass, 1 if any fails, 2 on bad input.")
    p.add_argument("suite", choices=sorted(SUITES), help="which suite (paper: the ZeRO paper's evaluation)")
    add_json_option(p, "the report")
    p.set_defaults(func=run_command)


def run_suite(name: str, progress: bool = False):
    """Run suite `name` and return its zsim.validate.report.Report."""
    return importlib.import_module(SUITES[name]).run(progress=progress)


def run_command(args: argparse.Namespace) -> int:
    if args.json is not None and args.json != "-":
        from zsim.report.outputs import check_file

        check_file(args.json)  # before minutes of simulation: a bad --json costs nothing
    report = run_suite(args.suite, progress=sys.stderr.isatty())
    print(report.table(), file=text_stream(args))
    emit_json(args, report.as_dict(), indent=1)
    return 0 if report.passed else EXIT_FAILED

"""`zsim validate SUITE`: run a validation suite (zsim.validate.SUITES) and print simulated against
published, per point, with pass/fail against each tolerance. Exit 0 when every point and check passes,
1 when any fails (docs/validation.md)."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

from zsim.validate import SUITES

EXIT_FAILED = 1


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "validate", help="compare simulations with published results (exit 1 if any point fails)",
        description="Run a validation suite and print, per point, the simulated and published value, the error, "
                    "whether the run fits in memory, and pass/fail against the point's tolerance. Suites: "
                    + ", ".join(SUITES) + ". Exit 0 if all pass, 1 if any fails, 2 on bad input.")
    p.add_argument("suite", choices=sorted(SUITES), help="which suite (paper: the ZeRO paper's evaluation)")
    p.add_argument("--json", metavar="PATH|-", help="also write the report as JSON to PATH (- = stdout, table to stderr)")
    p.set_defaults(func=run_command)


def run_suite(name: str, progress: bool = False):
    """Run suite `name` and return its zsim.validate.report.Report."""
    return importlib.import_module(SUITES[name]).run(progress=progress)


def run_command(args: argparse.Namespace) -> int:
    to_stdout = args.json == "-"
    report = run_suite(args.suite, progress=sys.stderr.isatty())
    print(report.table(), file=sys.stderr if to_stdout else sys.stdout)
    if args.json:
        text = json.dumps(report.as_dict(), indent=1) + "\n"
        if to_stdout:
            sys.stdout.write(text)
        else:
            Path(args.json).write_text(text)
    return 0 if report.passed else EXIT_FAILED

"""`zsim validate SUITE`: run a validation suite and print its error table; exit 1 if it fails.

Suites live in zsim/validate/<suite>.py and are registered in SUITES (issue 9 adds the paper suite;
this file is the minimal registration issue 10 needs until the two are merged).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

SUITES = {"replay": "held-out replay of real runs: record, calibrate on some, replay the others (docs/calibrate.md)"}


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("validate", help="run a validation suite and judge it",
                              description="Run a validation suite, print its error table and verdict. Exit 0 when "
                                          "every criterion holds, 1 when one fails, 2 on bad input.")
    p.add_argument("suite", choices=sorted(SUITES), help="; ".join(f"{k}: {v}" for k, v in SUITES.items()))
    p.add_argument("--suite-file", type=Path, default=None,
                   help="replay: the suite YAML (default scenarios/calibrate/suite-cpu.yaml)")
    p.add_argument("-o", "--output", type=Path, default=Path("out/validate-replay"), metavar="DIR",
                   help="where the recorded traces and the calibrated profile go (default out/validate-replay)")
    p.add_argument("--json", metavar="PATH", help="also write the outcome as JSON to PATH ('-' for stdout)")
    p.set_defaults(func=run_command)


def run_command(args: argparse.Namespace) -> int:
    from zsim.validate.replay import DEFAULT_SUITE, run_suite, table

    text = sys.stderr if args.json == "-" else sys.stdout
    quiet = not text.isatty()
    result = run_suite(args.suite_file or DEFAULT_SUITE, args.output,
                       progress=None if quiet else (lambda m: print(f"  {m}", file=text, flush=True)))
    print(table(result), file=text)
    if args.json:
        doc = {"suite": str(result.suite), "profile": str(result.profile), "passed": result.passed,
               "median_error": result.median_error, "max_error": result.max_error, "cores": result.cores,
               "load_average": list(result.load), "seconds": result.seconds, "calibration": result.calibration,
               "runs": [{"label": o.label, "measured_s": o.measured_s, "simulated_s": o.simulated_s, "error": o.error,
                         "model_states_exact": o.states_exact, "judged": o.judged} for o in result.outcomes]}
        if args.json == "-":
            json.dump(doc, sys.stdout, indent=1)
            sys.stdout.write("\n")
        else:
            Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    return 0 if result.passed else 1

"""`zsim trace`: record real traces with the PyTorch runtime (runtime/, docs/runtime.md).

Spawns --ranks processes on this machine (CPU + gloo, or one per GPU with NCCL), trains the model
of --model with ZeRO stage --stage for --steps steps and writes one trace per rank into -o DIR.
torch is imported only when the command runs.
"""

from __future__ import annotations

import argparse
import sys

from zsim.commands import HELP
from zsim.errors import ZsimError


def register(subparsers: argparse._SubParsersAction) -> None:
    from zsim.runtime.cli import add_run_arguments  # no torch import

    parser = subparsers.add_parser("trace", help=HELP["trace"],
                                   description=__doc__.splitlines()[0])
    add_run_arguments(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """The command: exit 0 when every rank finished, 1 when a rank failed (named on stderr);
    ConfigError (exit 2) for a bad model file or options, or when PyTorch is not installed."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise ZsimError("zsim trace runs the real PyTorch runtime, and PyTorch is not installed here: "
                        "pip install 'zsim[runtime]' (or pip install torch first, e.g. the CPU wheel from "
                        "https://download.pytorch.org/whl/cpu)")
    from zsim.runtime.cli import config_from_args
    from zsim.runtime.launch import Stopped, launch

    try:
        result = launch(config_from_args(args), progress=sys.stderr.isatty(), force=args.force)
    except Stopped as exc:
        print(f"zsim trace: stopped by {exc}; every rank was stopped", file=sys.stderr)
        return 128 + exc.signum
    if result.failure is not None:
        print(f"zsim trace: {result.failure}; the other ranks were stopped, their traces are in {result.out_dir}",
              file=sys.stderr)
        return 1
    s = result.summary
    losses = ", ".join(f"{x:.4f}" for x in s["losses"])
    print(f"zsim trace: {len(s['ranks'])} ranks, {len(s['losses'])} steps, losses {losses}")
    print(f"zsim trace: traces in {result.out_dir}/rank<R>.trace.json, summary in {result.out_dir}/summary.json")
    return 0

"""The `zsim` command: registers subcommands and prints user errors without a traceback.

Each subcommand lives in zsim/commands/<name>.py with `register(subparsers)`, which adds its parser
and sets `func(args) -> int` (the exit code). Command modules import heavy things (torch,
matplotlib) inside their functions, so that `zsim --help` and `zsim run` stay fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from zsim import __version__
from zsim.errors import ZsimError

COMMANDS = ("run", "memory", "maxsize", "collective", "nccl-fit", "calibrate", "replay", "validate", "trace")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="zsim",
        description="A digital twin of GPU training clusters for ZeRO-style training.",
    )
    parser.add_argument("--version", action="version", version=f"zsim {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"zsim.commands.{name.replace('-', '_')}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ZsimError as exc:
        print(f"zsim: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("zsim: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

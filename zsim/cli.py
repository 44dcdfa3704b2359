"""The `zsim` command: registers subcommands and prints user errors without a traceback.

Each subcommand lives in zsim/commands/<name>.py with `register(subparsers)`, which adds its parser
and sets `func(args) -> int` (the exit code). Command modules import heavy things (torch,
matplotlib) inside their functions, so that `zsim --help` and `zsim run` stay fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import NoReturn

from zsim import __version__
from zsim.errors import EXIT_BAD_INPUT, EXIT_OK, ZsimError, printable

COMMANDS = ("run", "memory", "maxsize", "collective", "nccl-fit", "trace")


MAX_LINE = 300  # characters of one error line: longer messages are cut


class Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors: `zsim run: error: ...` and a pointer to --help, instead of
    a usage block that can wrap over many lines (issue 13: at most two lines on stderr)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: {error_text(message)}\n(see '{self.prog} --help')\n")


def error_text(message: str, lines: int = 2) -> str:
    """`message` as at most `lines` lines of at most MAX_LINE printable characters each (control
    characters such as ANSI escapes replaced, so nothing a user wrote can drive the terminal)."""
    kept = [printable(line, MAX_LINE) for line in str(message).splitlines()[:lines]] or [""]
    return "\n".join(kept)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="zsim",
        description="A digital twin of GPU training clusters for ZeRO-style training.",
    )
    parser.add_argument("--version", action="version", version=f"zsim {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"zsim.commands.{name.replace('-', '_')}").register(subparsers)
    return parser


def _say(text: str) -> None:
    try:
        print(text, file=sys.stderr)
    except (OSError, ValueError):
        pass  # stderr itself is gone: nothing to tell


def _quiet_stdout() -> None:
    """After a closed pipe (`zsim ... | head`): point stdout at /dev/null so that the interpreter's
    final flush does not raise again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns its exit code. User errors (ZsimError) are printed in at most two
    lines, never with a traceback: 2 bad input, 3 out of memory, 130 interrupted. A closed stdout
    pipe ends quietly (0). Anything else is a bug: two lines and exit 1 (ZSIM_TRACEBACK=1 shows it)."""
    try:
        parser = build_parser()
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:  # --help, --version, or a usage error already printed (exit 2)
            return exc.code if isinstance(exc.code, int) else EXIT_BAD_INPUT
        return args.func(args)
    except ZsimError as exc:
        _say(error_text(f"zsim: {exc}"))
        return exc.exit_code
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_OK
    except KeyboardInterrupt:
        _say("zsim: interrupted")
        return 130
    except RecursionError:
        _say("zsim: the input is nested too deeply")
        return EXIT_BAD_INPUT
    except MemoryError:
        _say("zsim: this machine ran out of memory: the input is too large for it")
        return EXIT_BAD_INPUT
    except OSError as exc:  # the file system: a full disk, a read-only folder, a vanished file
        where = f"{exc.filename}: " if exc.filename else ""
        _say(error_text(f"zsim: {where}{exc.strerror or exc}"))
        return EXIT_BAD_INPUT
    except Exception as exc:  # a bug in zsim, not a user mistake
        if os.environ.get("ZSIM_TRACEBACK"):
            raise
        _say(error_text(f"zsim: internal error: {type(exc).__name__}: {exc}", lines=1))
        _say("zsim: this is a bug; ZSIM_TRACEBACK=1 shows where")
        return 1


if __name__ == "__main__":
    sys.exit(main())

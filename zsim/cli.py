"""The `zsim` command: registers subcommands and prints user errors without a traceback.

Each subcommand lives in zsim/commands/<name>.py (`validate`: zsim/validate/command.py) with
`register(subparsers)`, which adds its parser and sets `func(args) -> int` (the exit code). `zsim COMMAND ...` imports only that command's module;
`zsim`, `zsim --help` and `zsim --version` import none: the list of commands comes from the one-line
summaries in zsim.commands.HELP. Command modules import only the standard library and light zsim
modules at import time; numpy, simpy, networkx, msgspec, yaml, matplotlib and torch are imported
inside the functions that run the command, so a command's `--help` is fast too
(tests/test_cli_conventions.py and tests/test_fast_start.py check both, and the flag conventions).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys

from zsim import __version__
from zsim.commands import HELP
from zsim.console.parser import ArgumentParser, error_text
from zsim.console.signals import sigint_held
from zsim.errors import EXIT_BAD_INPUT, EXIT_OK, ZsimError, printable

COMMANDS = tuple(HELP)  # in the order `zsim --help` lists them


class VersionAction(argparse.Action):
    """`zsim --version`: zsim's version and those of the libraries its numbers depend on."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        sys.stdout.write(versions_text())
        parser.exit(0)


def versions() -> dict[str, str | None]:
    """{package: version} for zsim, Python and the libraries behind the numbers (None: not installed)."""
    import platform
    from importlib import metadata

    out: dict[str, str | None] = {"zsim": __version__, "python": platform.python_version()}
    for package in ("simpy", "numpy", "msgspec", "networkx", "scipy", "torch"):
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = None
    return out


def versions_text() -> str:
    v = versions()
    rest = ", ".join(f"{k} {val}" for k, val in v.items() if k not in ("zsim", "torch") and val)
    torch = f"torch {v['torch']}" if v["torch"] else "torch not installed (zsim trace needs pip install 'zsim[runtime]')"
    return f"zsim {v['zsim']}\n{rest}\n{torch}\n"


def build_parser(only: str | None = None, *, listing: bool = False) -> argparse.ArgumentParser:
    """The whole parser, or with `only` a command's name, a parser that registers just that command
    (what `main` builds for `zsim run ...`: importing and building the other commands' parsers
    would cost ~10% of a flagship run). With `listing`, the commands are names and one-line
    summaries only, no options (what `main` builds when no command is named: `zsim --help` lists
    the commands without importing their modules)."""
    parser = ArgumentParser(
        prog="zsim",
        description="A digital twin of GPU training clusters for ZeRO-style training.",
        epilog="Sizes: 32GB = 32·10⁹ bytes, 32GiB and 32G = 32·2³⁰; counts: 7.5B = 7.5·10⁹. "
               "`zsim COMMAND --help` for a command's options.",
    )
    parser.add_argument("--version", action=VersionAction, help="print the versions of zsim and its libraries")
    parser.command = only if not listing else None
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS if only is None else (only,):
        if listing:
            subparsers.add_parser(name, help=HELP[name])
        else:
            importlib.import_module(command_module(name)).register(subparsers)
    if "completion" in subparsers.choices:  # its script lists every command: the parser only cli builds
        subparsers.choices["completion"].set_defaults(whole_parser=build_parser)
    return parser


def command_module(name: str) -> str:
    """The module that registers command `name`: zsim/commands/<name>.py, except `validate`, which runs
    the suites of zsim.validate, a layer above the commands (docs/architecture.md): zsim/validate/command.py."""
    return "zsim.validate.command" if name == "validate" else f"zsim.commands.{name.replace('-', '_')}"


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
    pipe ends quietly (0). Anything else is a bug: two lines and exit 1 (ZSIM_TRACEBACK=1 shows it).
    `argv` None: the program itself (the `zsim` script, `python -m zsim`), which exits next."""
    if argv is not None:  # a caller in Python (tests, notebooks): the process goes on
        return _run(argv)
    # A command is a short-lived process that makes many objects and few cycles: collect the young
    # generation every 50,000 allocations instead of 700 (CPython's default). Measured on a noisy
    # 2-core VM, three flagship runs each way: 0.365-0.387 s of CPU against 0.386-0.463 s with the
    # default (0.02-0.08 s less). A long per-rank run still collects its cycles.
    gc.set_threshold(50_000, 10, 10)
    code = _run(sys.argv[1:])
    # The process exits next. Freezing the garbage collector's view of every object spares the
    # interpreter's shutdown a cycle collection over every module's objects (the models', the
    # simulation's): 0.05-0.12 s of a flagship run's CPU time, 0.01 s frozen. Objects are still
    # freed by reference counting, files flushed and atexit handlers run; only unreachable cycles
    # are left to the operating system.
    gc.freeze()
    return code


def _before_command(option: str, command: str | None) -> str:
    """The two lines for an option before the command other than zsim's own --help and --version: a
    misspelling of those, or a command's option in the wrong place."""
    import difflib

    close = difflib.get_close_matches(option, ["--help", "--version"], n=1, cutoff=0.75)
    if close:
        return f"zsim: unrecognized option {printable(option, 60)!r}; did you mean {close[0]!r}?\n" \
               "  (`zsim --help` lists the commands)"
    where = f"zsim {command} {printable(option, 60)} ..." if command else f"zsim COMMAND {printable(option, 60)} ..."
    return f"zsim: {printable(option, 60)!r} comes before the command; a command's options follow it ({where})\n" \
           "  (`zsim --help` lists the commands)"


def _run(argv: list[str]) -> int:
    try:
        at = next((i for i, a in enumerate(argv) if not a.startswith("-")), len(argv))
        command = argv[at] if at < len(argv) else None
        # The top-level help or version comes first (`zsim`, `zsim --help`, `zsim -h run`): list the commands.
        listing = command is None or any(a in ("-h", "--help", "--version") for a in argv[:at])
        stray = [a for a in argv[:at] if a not in ("-h", "--help", "--version")]
        if stray:  # argparse would say "arguments are required: COMMAND" for `zsim --verion`
            _say(error_text(_before_command(stray[0], command)))
            return EXIT_BAD_INPUT
        with sigint_held():  # building the parser imports C extensions (zlib, _bz2, _lzma via shutil)
            parser = build_parser(command if command in COMMANDS and not listing else None, listing=listing)
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

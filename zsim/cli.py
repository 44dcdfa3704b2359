"""The `zsim` command: registers subcommands and prints user errors without a traceback.

Each subcommand lives in zsim/commands/<name>.py with `register(subparsers)`, which adds its parser
and sets `func(args) -> int` (the exit code). Command modules import only the standard library and
light zsim modules at import time; numpy, simpy, networkx, pydantic, yaml, matplotlib and torch are
imported inside the functions that run the command, so `zsim --help` takes a few tens of ms
(tests/test_cli_conventions.py checks that no command breaks this, and the flag conventions).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from zsim import __version__
from zsim.errors import ZsimError

COMMANDS = ("run", "sweep", "memory", "maxsize", "collective", "nccl-fit", "calibrate", "replay", "validate",
            "trace", "profiles", "schema", "completion")


class ArgumentParser(argparse.ArgumentParser):
    """argparse with errors in two lines (the problem, then where to read the options), not the whole
    usage block. Subcommand parsers are of the same class (argparse's default parser_class)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: {message}\n  (`{self.prog} --help` lists the options)\n")


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
    for package in ("simpy", "numpy", "pydantic", "networkx", "scipy", "torch"):
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


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or with `only` a command's name, a parser that registers just that command
    (what `main` builds for `zsim run ...`: importing and building the other commands' parsers
    would cost ~10% of a flagship run)."""
    parser = ArgumentParser(
        prog="zsim",
        description="A digital twin of GPU training clusters for ZeRO-style training.",
        epilog="Sizes: 32GB = 32·10⁹ bytes, 32GiB and 32G = 32·2³⁰; counts: 7.5B = 7.5·10⁹. "
               "`zsim COMMAND --help` for a command's options.",
    )
    parser.add_argument("--version", action=VersionAction, help="print the versions of zsim and its libraries")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS if only is None else (only,):
        importlib.import_module(f"zsim.commands.{name.replace('-', '_')}").register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(command if command in COMMANDS else None)
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

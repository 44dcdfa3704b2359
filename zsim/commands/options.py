"""Options that mean the same thing in every command (README, "Command-line conventions").

- `--profile NAME|FILE`: the hardware (system) profile, by name or as a .yaml file path; `--hw` is a
  hidden alias kept for old scripts.
- `--profiles DIR` (repeatable): user profile folders searched before $ZSIM_PROFILE_PATH and the
  built-in profiles (zsim.config.profiles).
- `--json PATH|-`: also write the command's figures as JSON to PATH; with '-' the JSON goes to stdout
  and the human-readable text to stderr.

Nothing here imports more than the standard library at import time: `zsim --help` builds every
command's parser (tests/test_cli_conventions.py checks both).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zsim.errors import ZsimError

if TYPE_CHECKING:
    from zsim.config.profiles import Profiles


def add_profile_options(parser: argparse.ArgumentParser, *, profile: bool = True, required: bool = False,
                        default: str | None = None, what: str = "the hardware profile") -> None:
    """`--profile` (unless `profile` is False), its hidden alias `--hw`, and `--profiles DIR`."""
    if profile:
        need = " (required)" if required else (f" (default {default})" if default else "")
        parser.add_argument("--profile", metavar="NAME|FILE", default=default,
                            help=f"{what}: a system profile name (zsim profiles lists them) or a .yaml file{need}")
        parser.add_argument("--hw", dest="profile", help=argparse.SUPPRESS)
        parser.set_defaults(profile_required=required)
    parser.add_argument("--profiles", metavar="DIR", action="append", default=[],
                        help="a folder of your own profiles, searched before $ZSIM_PROFILE_PATH and the built-in "
                             "ones (repeatable; docs/profiles.md)")


def profile_search(args: argparse.Namespace) -> tuple[Profiles, str | None]:
    """The profile search path of this command line and the system profile name it gives (None when
    the command takes no --profile or it was not given).

    Raises:
        ZsimError: a required --profile is missing.
        ConfigError: a --profiles folder or a --profile file does not exist, or a bad name.
    """
    from zsim.config.profiles import Profiles

    profiles = Profiles.from_environment(args.profiles)
    text = getattr(args, "profile", None)
    if text is None:
        if getattr(args, "profile_required", False):
            raise ZsimError("--profile NAME|FILE is required (zsim profiles lists the names)")
        return profiles, None
    return profiles.resolve_system(text)


def json_path(text: str) -> str:
    """argparse type of --json: '-' or a file name that can be written (checked while the command line is
    read, before any work, in every command alike)."""
    if text == "-":
        return text
    from zsim.errors import ZsimError
    from zsim.report.outputs import check_file

    try:
        check_file(text)
    except ZsimError as exc:
        message = str(exc)
        raise argparse.ArgumentTypeError(message.split(": ", 1)[1] if ": " in message else message) from None
    return text


def hold_term(text: str) -> tuple[str, float]:
    """`--hold TERM=VALUE` of `zsim nccl-fit` and `zsim calibrate`: an inter-node term
    (zsim.calibrate.net_fit.TERMS) and a value within its fitting bounds. Raises
    argparse.ArgumentTypeError (exit 2, naming the flag)."""
    from zsim.calibrate.net_terms import BOUNDS, TERMS

    term, sep, value = text.partition("=")
    if not sep or term not in TERMS:
        raise argparse.ArgumentTypeError(f"{text!r}: expected TERM=VALUE with TERM one of {', '.join(TERMS)}")
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: {value!r} is not a number") from None
    lo, hi = BOUNDS[term]
    if not lo <= number <= hi:  # NaN fails both
        raise argparse.ArgumentTypeError(f"{text!r}: {term} must lie in [{lo:g}, {hi:g}]")
    return term, number


def held_terms(pairs: list[tuple[str, float]]) -> dict[str, float]:
    """The `--hold` pairs (hold_term) as {term: value}, checked as a whole: a term given twice is ambiguous
    (the last would silently win), and holding every term leaves nothing to fit.

    Raises:
        ZsimError: a term held twice (naming it and both values), or every term held.
    """
    from zsim.calibrate.net_terms import TERMS

    held: dict[str, float] = {}
    for term, value in pairs:
        if term in held:
            raise ZsimError(f"--hold {term}: given twice ({held[term]:g} and {value:g}); hold a term once")
        held[term] = value
    if set(held) >= set(TERMS):
        raise ZsimError(f"--hold: all {len(TERMS)} inter-node terms held, nothing is left to fit; drop the --hold "
                        "of a term to fit it (to time given terms, write them in a network profile and run "
                        "zsim collective)")
    return held


def add_json_option(parser: argparse.ArgumentParser, what: str = "the figures") -> None:
    """`--json PATH|-`."""
    parser.add_argument("--json", metavar="PATH|-", type=json_path,
                        help=f"also write {what} as JSON to PATH; '-' writes JSON to stdout and the text to stderr")


def text_stream(args: argparse.Namespace):
    """Where the human-readable text goes: stderr when the JSON goes to stdout."""
    return sys.stderr if getattr(args, "json", None) == "-" else sys.stdout


class PrintableText:
    """A text stream that writes only printable characters and line breaks: what a command echoes from
    its inputs (trace event names, profile names and fields, file names) cannot move the cursor, retitle
    the terminal or hide text (control characters and ANSI escapes become '?', as zsim.errors.printable)."""

    def __init__(self, stream) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        return self.stream.write("".join(c if c.isprintable() or c == "\n" else "?" for c in text))

    def flush(self) -> None:
        self.stream.flush()


def printable_text(args: argparse.Namespace) -> PrintableText:
    """text_stream(args), with control characters replaced (PrintableText)."""
    return PrintableText(text_stream(args))


def emit_json(args: argparse.Namespace, data: Any, indent: int | None = 2) -> None:
    """Write `data` where --json says (nothing without --json)."""
    if not args.json:
        return
    text = json.dumps(data, indent=indent, allow_nan=False) + "\n"  # never Infinity/NaN (not JSON)
    if args.json == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    from zsim.report.outputs import write_atomic

    write_atomic(Path(args.json), text)  # whole or absent, never half written

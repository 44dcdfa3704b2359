"""The argument parser of every zsim front end (`zsim`, `python -m zsim.runtime`): errors in two short
lines with a suggestion for a misspelt choice or option, and the one way a message is cut to printable
lines (error_text)."""

from __future__ import annotations

import argparse
import re

from zsim.errors import EXIT_BAD_INPUT, printable

TYPE_CHECKING = False  # typing itself costs ~5% of `zsim --help`
if TYPE_CHECKING:
    from typing import NoReturn

MAX_LINE = 300  # characters of one error line: longer messages are cut


class ArgumentParser(argparse.ArgumentParser):
    """argparse with errors in two lines (the problem, then where to read the options), not the whole
    usage block that can wrap over many lines (issue 13: at most two lines on stderr). Subcommand
    parsers are of the same class (argparse's default parser_class)."""

    command: str | None = None  # the top-level parser's one command, when it was built for one

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        # Arguments no parser took are reported by the top-level parser: point at the command's help.
        where = f"{self.prog} {self.command}" if self.command else self.prog
        message = _did_you_mean(message, self._command_options())
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: {error_text(message, lines=1)}\n  (`{where} --help` lists the options)\n")

    def _command_options(self) -> list[str]:
        """The option strings of the command this top-level parser was built for ([] otherwise)."""
        commands = next((a.choices for a in self._actions if isinstance(a, argparse._SubParsersAction)), {})
        command = commands.get(self.command) if self.command else None
        return [o for a in command._actions for o in a.option_strings] if command is not None else []


Parser = ArgumentParser  # the name the runtime's entry points use

_INVALID_CHOICE = re.compile(r"invalid choice: '(?P<value>.*)' \(choose from (?P<choices>.*)\)$")


def _did_you_mean(message: str, options: list[str]) -> str:
    """argparse's "invalid choice: 'runn' (choose from 'run', ...)" with "; did you mean 'run'?" after the
    value when one choice is close (difflib, as for the config's unknown keys); "unrecognized arguments:
    --no-plott" with the close one of the command's `options`."""
    import difflib

    if message.startswith("unrecognized arguments:") and options:
        for word in message.removeprefix("unrecognized arguments:").split():
            close = difflib.get_close_matches(word.split("=")[0], options, n=1) if word.startswith("--") else []
            if close:
                return f"{message}; did you mean {close[0]!r}?"
        return message
    found = _INVALID_CHOICE.search(message)
    if not found:
        return message
    close = difflib.get_close_matches(found["value"], re.findall(r"'([^']*)'", found["choices"]), n=1)
    if not close:
        return message
    at = found.start("choices") - len(" (choose from ")  # before the list, which a long line may lose
    return f"{message[:at]}; did you mean {close[0]!r}?{message[at:]}"


def error_text(message: str, lines: int = 2) -> str:
    """`message` as at most `lines` lines of at most MAX_LINE printable characters each (control
    characters such as ANSI escapes replaced, so nothing a user wrote can drive the terminal)."""
    kept = [printable(line, MAX_LINE) for line in str(message).splitlines()[:lines]] or [""]
    return "\n".join(kept)

"""Typed errors for user mistakes. The CLI prints them in one or two lines, without a traceback.

Exit codes (documented in the README):
  0  success (the scenario fits)
  2  bad input: a scenario or profile that cannot be loaded, or a layout or model that cannot work
  3  the simulation ran and the scenario runs out of GPU memory (OOM)
"""

import reprlib
from collections.abc import Callable


EXIT_OK = 0
EXIT_BAD_INPUT = 2
EXIT_OOM = 3


class ZsimError(Exception):
    """A mistake in what the user gave zsim; printed as `zsim: <message>`, exit code 2."""

    exit_code = EXIT_BAD_INPUT


class ConfigError(ZsimError):
    """A scenario or hardware profile that is invalid. `source` is the file, `path` the dotted key."""

    def __init__(self, message: str, *, source: str | None = None, path: str | None = None):
        self.source = source
        self.path = path
        self.message = message  # without the file and key: for re-addressing (zsim.scenario.scenario.blame_override)
        where = ": ".join(p for p in (source, path) if p)
        super().__init__(f"{where}: {message}" if where else message)


# How a scenario check refuses: fail(dotted key, message) gives the ConfigError to raise, addressed to the file
# (zsim.scenario.scenario builds it; the pipeline, MoE, recompute and context-parallel checks take it).
Fail = Callable[[str, str], ConfigError]


class ModelStatesError(ConfigError):
    """A scenario whose model states alone exceed the GPU (ZeRO Table 1): valid in every key, too big for
    the cluster; `zsim maxsize` reads it as "this many layers do not fit", not as a mistake."""


MAX_VALUE_CHARS = 40  # characters of a bad value quoted in a message

_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = _repr.maxlong = MAX_VALUE_CHARS
_repr.maxlist = _repr.maxdict = _repr.maxtuple = _repr.maxset = 4
_repr.maxlevel = 2


def short(value: object) -> str:
    """A short, printable repr of `value` for an error message: at most ~MAX_VALUE_CHARS characters of
    a string (control characters escaped by repr), four items of a container, two levels deep; cheap
    on a huge or shared (aliased) structure."""
    text = _repr.repr(value)
    return text if len(text) <= 2 * MAX_VALUE_CHARS else text[: 2 * MAX_VALUE_CHARS] + "..."


def printable(text: str, limit: int = 200) -> str:
    """`text` with control characters (ANSI escapes, NUL, newlines...) replaced by '?' and cut to
    `limit` characters: for echoing names and descriptions a user wrote to the terminal."""
    clean = "".join(c if c.isprintable() else "?" for c in text[: limit + 1])
    return clean if len(clean) <= limit else clean[:limit] + "..."

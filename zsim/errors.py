"""Typed errors for user mistakes. The CLI prints them in one or two lines, without a traceback.

Exit codes (documented in the README):
  0  success (the scenario fits)
  2  bad input: a scenario or profile that cannot be loaded, or a layout or model that cannot work
  3  the simulation ran and the scenario runs out of GPU memory (OOM)
"""

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
        where = ": ".join(p for p in (source, path) if p)
        super().__init__(f"{where}: {message}" if where else message)

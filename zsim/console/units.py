"""Parsing the numbers people type on the command line, one grammar for every command (README,
"Command-line conventions"), and argparse types built on them (a bad value is argparse's two-line
error, exit 2).

Sizes in bytes: `32GB` = 32·10⁹ (SI, as the ZeRO paper's GB), `32GiB` = 32·2³⁰ (IEC), and a bare
letter `32G` = 32·2³⁰: binary, as nccl-tests' -b/-e and as the "32 GB" of a V100 mean. K, M, G, T
work alike; a plain number is bytes. Counts (parameters, elements): `7.5e9`, `7.5B`, `1T`, `1_000`
(B and G = 10⁹, powers of ten).
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable

from zsim.errors import ZsimError

_NUMBER = r"\s*([0-9_.]+(?:e[+-]?\d+)?)\s*"
_COUNT = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
_BYTES = {"": 1, "b": 1,
          "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,  # SI
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,  # IEC
          "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}  # bare letter: binary (nccl-tests, "32 GB" V100)


# Upper bounds of command-line numbers (issue 13): far above real use, far below float overflow.
MAX_COUNT = 1e18  # parameters, elements
MAX_BYTES = 2.0**60  # memory sizes (1 EiB)
MAX_NCCL_BYTES = 2**40  # one collective's payload (1 TiB): the table is simulated size by size
MAX_INT_OPTION = 10**9  # integer options (degrees, shapes, counts)


def _shown(text: str) -> str:
    """A short, printable quote of what the user typed."""
    return repr(text[:40] + ("..." if len(text) > 40 else ""))


def _parse(text: str, units: dict[str, float], expected: str, what: str = "", maximum: float = MAX_COUNT) -> float:
    m = re.fullmatch(_NUMBER + r"([a-zA-Z]*)\s*", text[:100])
    unit = m.group(2).lower() if m else ""
    try:
        value = float(m.group(1).replace("_", "")) * units[unit] if m and unit in units else None
    except ValueError:
        value = None
    return checked(value, text, expected, what, maximum)


def checked(value: float | None, text: str, expected: str, what: str = "", maximum: float = MAX_COUNT) -> float:
    """`value` if it is a finite number in (0, maximum]; else ZsimError quoting `text` (1e400 is inf)."""
    if value is None or not math.isfinite(value) or value <= 0 or value > maximum:
        raise ZsimError(f"{what}{_shown(text)}: expected {expected}" + (f" (at most {maximum:.3g})" if value and
                                                                        math.isfinite(value) and value > maximum else ""))
    return value


def whole(value: float, text: str, expected: str, what: str = "") -> int:
    """`value` as an integer >= 1: a fraction that is not a whole number (0.4, 1.5) is a ZsimError,
    not silently rounded (to 0)."""
    n = round(value)
    if n < 1 or abs(value - n) > 1e-9 * value:
        raise ZsimError(f"{what}{_shown(text)}: expected {expected} (a whole number, got {value:g})")
    return n


def parse_count(text: str) -> int:
    """'7.5e9', '7.5B', '1T', '1_000' -> an integer count. Raises ZsimError."""
    expected = "a positive count like 7.5e9, 7.5B or 1T"
    return whole(_parse(text, _COUNT, expected), text, expected)


def parse_bytes(text: str) -> int:
    """'32GB' -> 32·10⁹, '32GiB' and '32G' -> 32·2³⁰, '1e9' -> 10⁹ bytes. Raises ZsimError."""
    expected = "a size like 32GB (10^9 bytes), 32GiB or 32G (2^30 bytes), or bytes"
    return whole(_parse(text, _BYTES, expected, maximum=MAX_BYTES), text, expected)


def parse_size(text: str) -> int:
    """nccl-tests -b/-e sizes: the same grammar (bare K/M/G binary, as in nccl-tests), at most
    MAX_NCCL_BYTES: the table is simulated size by size. Raises ZsimError."""
    expected = "a positive size like 8, 128K, 8M or 8G (binary), or 8MB (10^6 bytes)"
    return whole(_parse(text, _BYTES, expected, maximum=MAX_NCCL_BYTES), text, expected)


def argtype(parse: Callable[[str], int]) -> Callable[[str], int]:
    """An argparse `type` from a parser that raises ZsimError."""
    def convert(text: str) -> int:
        try:
            return parse(text)
        except ZsimError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    convert.__name__ = parse.__name__
    return convert


size_arg = argtype(parse_bytes)
nccl_size_arg = argtype(parse_size)
count_arg = argtype(parse_count)


def positive(flag: str, maximum: int = MAX_INT_OPTION) -> Callable[[str], int]:
    """An argparse `type` for an integer option `flag` in 1..maximum ('1e3', '2.0', 'true' are not)."""
    def parse(text: str) -> int:
        try:
            value = int(text[:30]) if len(text) <= 30 else 0
        except ValueError:
            value = 0
        if not 1 <= value <= maximum:
            raise argparse.ArgumentTypeError(f"{flag} {_shown(text)}: expected a positive integer (at most {maximum:,})")
        return value
    return parse


def positive_float(flag: str, maximum: float = 1e12) -> Callable[[str], float]:
    """An argparse `type` for a finite number in (0, maximum] (`nan`, `inf`, `1e400`, 0 are not)."""
    def parse(text: str) -> float:
        try:
            value = float(text[:40])
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and 0 < value <= maximum):
            raise argparse.ArgumentTypeError(f"{flag} {_shown(text)}: expected a finite number > 0 and <= {maximum:g}")
        return value
    return parse

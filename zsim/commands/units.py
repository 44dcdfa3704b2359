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
import re
from collections.abc import Callable

from zsim.errors import ZsimError

_NUMBER = r"\s*([0-9_.]+(?:e[+-]?\d+)?)\s*"
_COUNT = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
_BYTES = {"": 1, "b": 1,
          "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,  # SI
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,  # IEC
          "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}  # bare letter: binary (nccl-tests, "32 GB" V100)


def _parse(text: str, units: dict[str, float], expected: str) -> float:
    m = re.fullmatch(_NUMBER + r"([a-zA-Z]*)\s*", text)
    unit = m.group(2).lower() if m else ""
    try:
        value = float(m.group(1).replace("_", "")) * units[unit] if m and unit in units else None
    except ValueError:
        value = None
    if value is None or value <= 0:
        raise ZsimError(f"{text!r}: expected {expected}")
    return value


def parse_count(text: str) -> int:
    """'7.5e9', '7.5B', '1T', '1_000' -> an integer count. Raises ZsimError."""
    return round(_parse(text, _COUNT, "a positive count like 7.5e9, 7.5B or 1T"))


def parse_bytes(text: str) -> int:
    """'32GB' -> 32·10⁹, '32GiB' and '32G' -> 32·2³⁰, '1e9' -> 10⁹ bytes. Raises ZsimError."""
    return int(_parse(text, _BYTES, "a size like 32GB (10^9 bytes), 32GiB or 32G (2^30 bytes), or bytes"))


# nccl-tests -b/-e sizes follow the same grammar: their bare K/M/G are binary, as in nccl-tests.
parse_size = parse_bytes


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
count_arg = argtype(parse_count)


def positive(flag: str) -> Callable[[str], int]:
    """An argparse `type` for a positive integer option `flag`."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{flag} {text!r}: expected a positive integer")
        return value
    return parse

"""Parsing the numbers people type on the command line: counts, memory sizes, nccl-tests sizes, and
argparse types built on them (a bad value is argparse's one-line error, exit 2)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable

from zsim.errors import ZsimError

_NUMBER = r"\s*([0-9_.]+(?:e[+-]?\d+)?)\s*"
_COUNT = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
_MEMORY = {"": 1, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "kib": 2**10, "mib": 2**20,
           "gib": 2**30, "tib": 2**40}
_NCCL_TESTS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30}  # nccl-tests -b/-e: powers of 1024


def _parse(text: str, units: dict[str, float], expected: str, what: str = "") -> float:
    m = re.fullmatch(_NUMBER + r"([a-zA-Z]*)\s*", text)
    unit = m.group(2).lower() if m else ""
    try:
        value = float(m.group(1).replace("_", "")) * units[unit] if m and unit in units else None
    except ValueError:
        value = None
    if value is None or value <= 0:
        raise ZsimError(f"{what}{text!r}: expected {expected}")
    return value


def parse_count(text: str) -> int:
    """'7.5e9', '7.5B', '1T', '1_000' -> an integer count. Raises ZsimError."""
    return round(_parse(text, _COUNT, "a positive count like 7.5e9, 7.5B or 1T"))


def parse_bytes(text: str) -> int:
    """'32GB' -> 32e9 (the paper's GB), '32GiB' -> 32·2³⁰, '1e9' -> bytes. Raises ZsimError."""
    return int(_parse(text, _MEMORY, "a memory size like 32GB (10^9 bytes) or 32GiB (2^30 bytes)"))


def parse_size(text: str) -> int:
    """nccl-tests sizes: '8', '128K', '8M', '8G' (powers of 1024; a trailing B is allowed). Raises ZsimError."""
    t = text.strip()
    t = t[:-1] if len(t) > 1 and t[-1] in "bB" else t  # '8MB' = '8M', '8B' = '8'
    return int(_parse(t, _NCCL_TESTS, "a positive size like 8, 128K, 8M or 8G", what="size "))


def argtype(parse: Callable[[str], int]) -> Callable[[str], int]:
    """An argparse `type` from a parser that raises ZsimError."""
    def convert(text: str) -> int:
        try:
            return parse(text)
        except ZsimError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    convert.__name__ = parse.__name__
    return convert


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

"""Command-line numbers: counts, memory sizes and nccl-tests sizes."""

import pytest

from zsim.console.units import parse_bytes, parse_count, parse_size
from zsim.errors import ZsimError


def test_nccl_tests_sizes_are_powers_of_1024():
    assert parse_size("8") == parse_size("8B") == 8
    assert parse_size("128K") == 128 * 2**10 and parse_size("8M") == 8 * 2**20 and parse_size("8G") == 8 * 2**30


def test_one_grammar_si_iec_and_bare_letters():
    """32GB is SI (the paper's GB), 32GiB IEC, a bare 32G binary (nccl-tests, the "32 GB" V100)."""
    assert parse_bytes("32GB") == 32 * 10**9 and parse_bytes("32GiB") == 32 * 2**30 and parse_bytes("1e9") == 10**9
    assert parse_bytes("32G") == parse_bytes("32gib") == 32 * 2**30 and parse_bytes("8MB") == 8 * 10**6
    assert parse_bytes("1.5T") == int(1.5 * 2**40) and parse_bytes("512KiB") == 512 * 2**10
    for text in ("8", "128K", "8M", "8MB", "8G", "1GiB"):  # nccl-tests -b/-e: the same grammar, capped at 1 TiB
        assert parse_size(text) == parse_bytes(text)


@pytest.mark.parametrize("parse,bad", [(parse_size, "8X"), (parse_size, "0"), (parse_bytes, "32 parsecs"),
                                       (parse_count, "-1"), (parse_count, "7.5Q")])
def test_bad_numbers_name_the_value(parse, bad):
    with pytest.raises(ZsimError, match=repr(bad).replace(".", r"\.")):
        parse(bad)

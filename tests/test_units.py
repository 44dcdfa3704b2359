"""Command-line numbers: counts, memory sizes and nccl-tests sizes."""

import pytest

from zsim.commands.units import parse_bytes, parse_count, parse_size
from zsim.errors import ZsimError


def test_nccl_tests_sizes_are_powers_of_1024():
    assert parse_size("8") == parse_size("8B") == 8
    assert parse_size("128K") == 128 * 2**10 and parse_size("8MB") == 8 * 2**20 and parse_size("8G") == 8 * 2**30


def test_memory_sizes_follow_the_paper_and_iec():
    assert parse_bytes("32GB") == 32 * 10**9 and parse_bytes("32GiB") == 32 * 2**30 and parse_bytes("1e9") == 10**9


@pytest.mark.parametrize("parse,bad", [(parse_size, "8X"), (parse_size, "0"), (parse_bytes, "32 parsecs"),
                                       (parse_count, "-1"), (parse_count, "7.5Q")])
def test_bad_numbers_name_the_value(parse, bad):
    with pytest.raises(ZsimError, match=repr(bad).replace(".", r"\.")):
        parse(bad)

"""zsim.report.table: every row of a table has its columns at the same offsets."""

import pytest

from zsim.report.table import format_table


def test_columns_line_up_whatever_the_cells_hold():
    rows = [["step time (median, steps 3-10)", "123.456", "ms"], ["op", "1.2", "MB"]]
    lines = format_table(rows, header=[["", "measured", "unit"]], align="<><")
    ends = {line.index(cell) + len(cell) for line, cell in zip(lines, ["measured", "123.456", "1.2"])}
    starts = {line.index(cell) for line, cell in zip(lines, ["unit", "ms", "MB"])}
    assert len(ends) == 1 and len(starts) == 1, lines
    assert all(line == line.rstrip() for line in lines)


def test_a_bad_alignment_is_refused():
    with pytest.raises(ValueError, match="'x'"):
        format_table([["a"]], align="x")

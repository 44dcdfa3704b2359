"""The one fixed-width table printer of zsim's text output (issue 28, part 7): `zsim replay`, `memory`,
`nccl-fit`, `calibrate`, `validate` and the sweep summary lay their tables out here, so every row of a
table has its columns at the same offsets whatever the cells hold. Cells are strings the caller formatted
(numbers with their units and precision); the printer only pads. A plain module rather than `tabulate`:
these tables need padding and alignment only, and `zsim --help` imports nothing it does not use."""

from __future__ import annotations

from collections.abc import Sequence

ALIGNS = ("<", ">")  # left, right


def format_table(rows: Sequence[Sequence[str]], header: Sequence[Sequence[str]] = (), align: str = "",
          indent: str = "  ", gap: str = " ") -> list[str]:
    """The lines of a table: `header` rows, then `rows`, each column as wide as its widest cell, cells
    separated by `gap` and padded by `align` (one character per column, '<' left or '>' right; missing:
    the first column left, the others right). A row shorter than the others leaves its last columns
    empty; the last column is not padded on the right (no trailing spaces).

    Raises:
        ValueError: an `align` character other than '<' or '>'.
    """
    every = [list(map(str, row)) for row in (*header, *rows)]
    columns = max((len(row) for row in every), default=0)
    aligns = (align or "<").ljust(columns, ">")[:columns]
    bad = sorted(set(aligns) - set(ALIGNS))
    if bad:
        raise ValueError(f"align {align!r}: {', '.join(map(repr, bad))} is not '<' (left) or '>' (right)")
    every = [row + [""] * (columns - len(row)) for row in every]
    widths = [max((len(row[c]) for row in every), default=0) for c in range(columns)]
    lines = []
    for row in every:
        cells = [format(cell, f"{a}{w}") for cell, a, w in zip(row, aligns, widths)]
        lines.append((indent + gap.join(cells)).rstrip())
    return lines

"""Validation suites: simulated against measured or published numbers, with criteria that can fail.

SUITES maps a suite's name (`zsim validate NAME`) to the module that runs it; each module has
`run(progress) -> report` with `.table()`, `.as_dict()` and `.passed` (issue 9 adds `paper`; merge
the two dicts).
"""

from __future__ import annotations

SUITES: dict[str, str] = {
    "replay": "zsim.validate.replay",  # held-out replay of real runtime runs on this machine (docs/calibrate.md)
}

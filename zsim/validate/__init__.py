"""Validation suites: simulated against published numbers, each point with a tolerance that can fail.

SUITES maps a suite's name (`zsim validate NAME`) to the module that runs it; each module has
`run(progress) -> Report` (zsim.validate.report). Issue 10 adds `replay` here.
"""

from __future__ import annotations

SUITES: dict[str, str] = {
    "paper": "zsim.validate.paper",  # the ZeRO paper's evaluation (docs/validation.md)
}
